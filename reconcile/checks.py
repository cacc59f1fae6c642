"""Pure decisions: compare what hookledger knows with what the provider says.

:func:`decide` takes one subject's local view and the provider's answer and returns a
:class:`Verdict`: what to recover, which discrepancies to open, which to resolve.
:func:`settle` says whether an open discrepancy is resolved by the projection as it now
stands (a late webhook that agrees), with no API call. No clock, no I/O.

Rules, in words:

* provider terminal, we know nothing or only a non-terminal state, or a legitimate later
  state (a refund after a confirmation) -> **recover** the provider's state, open
  ``missing_webhook`` (a webhook was lost);
* provider terminal with another outcome that is not a successor of ours ->
  ``status_mismatch`` (never recovered: a webhook-confirmed state is not overridden);
* same outcome, other amount -> ``amount_mismatch`` (also: paid amount != expected amount);
* provider not terminal after the resolution window -> ``unresolved``;
* provider does not know the reference (after the window) -> ``unknown_at_provider``;
* an error answer decides nothing (it is recorded, and the subject asked again later).

``missing_webhook`` is resolved only by the late webhook itself (see :func:`settle`): a
re-check agrees with a recovered state by construction, so it proves nothing.

A finding a person resolved (``hookledger resolve``) is not opened again while a check
finds exactly it again (its kind and detail, which name the states and amounts, read with
one spelling per amount: 1000 and 1000.00 are the same money): the person has looked, and
a mismatch so found is settled (asked about again once its row changes).
An answer that changed is a new finding.

A finding of a kind already open is news only when the provider's outcome changed: the
recovered success whose refund a later check finds opens a ``missing_webhook`` for the
refund and resolves the one for the success as superseded, so the open finding never tells
someone to deliver goods for money that went back. The same outcome again opens nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from ledger.money import difference
from reconcile.client import Lookup
from reconcile.records import RECOVERY_EVENT, TERMINAL, ProviderRecord

CHECK_KINDS = ("missing_webhook", "status_mismatch", "amount_mismatch", "unresolved",
               "unknown_at_provider")
SUCCESSORS: dict[str, dict[str, frozenset[str]]] = {
    "collection": {"success": frozenset({"refunded"})},
    "payout": {},
}


@dataclass(frozen=True, slots=True)
class OpenDiscrepancy:
    id: str
    kind: str
    facts: Mapping[str, Any] = field(default_factory=dict)
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Local:
    """What hookledger knows about one collection or payout."""

    subject: str  # "collection" | "payout"
    reference: str
    outcome: str | None = None  # None: no webhook (nor recovery) yet
    status: str | None = None
    amount: Decimal | None = None
    recovered: bool = False
    since: datetime | None = None  # initiated (expectation) or last change
    expected_amount: Decimal | None = None
    open: tuple[OpenDiscrepancy, ...] = ()
    # the kinds of other records under this reference that a resolved status_mismatch
    # already reported (a person looked): not reported again while the record stays one
    looked_at_kinds: frozenset[str] = frozenset()
    # (kind, detail) of the findings a person resolved: the same finding is not opened
    # again (no webhook settles a short payment a person accepted); a changed one is news
    dismissed: frozenset[tuple[str, str]] = frozenset()
    # the provider's own spelling of the reference (``case-1`` for ``CASE-1``) when
    # hookledger already has a row under it, from its webhooks: recovered under this one,
    # the same money would be in the view twice
    known_as: str | None = None


@dataclass(frozen=True, slots=True)
class Detection:
    kind: str
    detail: str
    amount_at_risk: Decimal | None
    facts: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Verdict:
    result: str  # agrees | recovered | mismatch | unresolved | pending | unknown | error
    recover: ProviderRecord | None = None
    detect: tuple[Detection, ...] = ()
    resolve: tuple[tuple[str, str], ...] = ()  # (discrepancy id, reason)
    settled: bool = False  # nothing left to ask the provider about, until the row changes


def _risk(*amounts: Decimal | None) -> Decimal | None:
    known = [a for a in amounts if a is not None]
    return max(known) if known else None


def _tzs(amount: Decimal) -> str:
    """An amount as a finding's text shows it: in digits (``1000``, ``0.0000001``), never
    ``str``'s ``1E+3`` or ``1E-7``, which a provider whose encoder strips trailing zeros
    sends and which no person reading a report takes for an amount."""
    return format(amount, "f")


def _apart(one: Decimal, other: Decimal) -> Decimal:
    """How far two amounts are apart, exactly (``abs(a - b)`` rounds to 28 digits, and
    amounts of up to 16 digits and 15 places and more are read)."""
    return difference(max(one, other), min(one, other))


def _provider_facts(record: ProviderRecord) -> dict[str, Any]:
    return {"provider_outcome": record.outcome, "provider_status": record.status,
            "provider_amount": None if record.amount is None else _tzs(record.amount),
            "provider_code": record.code}


def _webhooks_say(local: Local) -> str:
    """What hookledger was told of a subject the provider denies knowing: a webhook that
    said paid, for a payment the provider never had, is forged, misdirected or of another
    account, and the finding must say so (it read as an initiation that failed, while the
    payments view showed success and the goods went out)."""
    if local.outcome is None:
        return ""
    told = "its recovered record said" if local.recovered else "yet its webhooks said"
    status = f" ({local.status})" if local.status else ""
    warning = (": do not fulfil or pay on it until the provider confirms"
               if local.outcome == "success" else "")
    return f"; {told} {local.outcome}{status}{warning}"


def decide(local: Local, lookup: Lookup, *, now: datetime, window: timedelta) -> Verdict:
    """The verdict for one subject; at most one discrepancy of a kind is open (see above)."""
    overdue = local.since is None or now - local.since >= window
    if lookup.kind == "error":
        return Verdict("error")
    found: list[Detection] = []
    resolve: list[tuple[str, str]] = []
    if lookup.kind == "not_found" or lookup.record is None:
        if overdue:
            found.append(Detection(
                "unknown_at_provider",
                f"the provider has no record of {local.subject} {local.reference}"
                + _webhooks_say(local),
                _risk(local.amount, local.expected_amount),
                {"webhook_outcome": local.outcome} if local.outcome is not None else {}))
        return _verdict("unknown", None, found, resolve, local, settled=False)

    record = lookup.record
    resolve += [(d.id, "the provider now knows the reference") for d in local.open
                if d.kind == "unknown_at_provider"]
    other = record.not_a(local.subject)
    if other is not None:
        # Another kind's record under this reference: nothing of it is this subject's state
        # or money. Its facts carry no provider_outcome, so no webhook settles this by
        # happening to agree with that other record, and no provider_code, whose retry
        # advice (in reports) would be the other record's. Not settled: the record may yet
        # become this subject's (the payment made, its webhook lost), so it is asked about
        # again after the backoff; once resolved, the same other kind is not reported again.
        if other.kinds_text not in local.looked_at_kinds:
            found.append(Detection(
                "status_mismatch",
                f"the provider's record of {local.reference} is not a {local.subject} "
                f"({other}); nothing recovered, to be checked by a person",
                _risk(local.amount, local.expected_amount),
                {"provider_record_kind": str(other), "provider_kinds": other.kinds_text,
                 "provider_event": record.event, "provider_service": record.service,
                 "provider_type": record.type, "provider_record_code": record.code}))
        return _verdict("mismatch", None, found, resolve, local, settled=False)
    # a record of another kind reported earlier: the record is this subject's now, whatever
    # else this check finds (an amount that differs is an amount_mismatch's to carry)
    resolve += [(d.id, f"the provider's record is now a {local.subject}") for d in local.open
                if d.kind == "status_mismatch" and "provider_kinds" in d.facts]
    facts = _provider_facts(record)
    if not record.terminal:
        if overdue and local.outcome in TERMINAL:
            # our webhooks call it final and the provider does not: a state that no later
            # webhook can settle (it already came), so not "unresolved"
            found.append(Detection(
                "status_mismatch",
                f"webhooks say {local.status} ({local.outcome}), the provider still says "
                f"{record.status or 'pending'} after the resolution window",
                _risk(local.amount, record.amount), facts))
            return _verdict("mismatch", None, found, resolve, local, settled=False)
        if overdue:
            found.append(Detection(
                "unresolved",
                f"{local.subject} {local.reference} is still {record.status or 'pending'} at "
                f"the provider after the resolution window",
                _risk(local.expected_amount, local.amount, record.amount), facts))
        return _verdict("unresolved" if overdue else "pending", None, found, resolve,
                        local, settled=False)

    resolve += [(d.id, "the provider reports a final state") for d in local.open
                if d.kind == "unresolved"]
    recover: ProviderRecord | None = None
    ours = local.outcome
    later = SUCCESSORS.get(local.subject, {}).get(ours or "", frozenset())
    behind = ours is None or ours not in TERMINAL or record.outcome in later
    if behind and (local.subject, record.outcome) not in RECOVERY_EVENT:
        found.append(Detection(  # no webhook carries this state: nothing to fold it as
            "status_mismatch",
            f"the provider reports {record.status} ({record.outcome}) for {local.subject} "
            f"{local.reference}, a state no {local.subject} webhook carries; not recovered, "
            f"to be checked by a person", _risk(local.amount, record.amount), facts))
    elif behind and local.known_as is not None:
        # webhooks brought this payment under the provider's spelling: recovered under
        # ours, the same money would be in the view twice
        found.append(Detection(
            "status_mismatch",
            f"the provider knows {local.subject} {local.reference} as {local.known_as}, "
            f"which webhooks already brought; nothing recovered, to be checked by a person "
            f"(register references as the provider spells them)",
            _risk(local.expected_amount, record.amount),
            {**facts, "provider_reference": local.known_as}))
    elif behind:  # the provider knows a state our webhooks never brought
        recover = record
        known = "no webhook" if ours is None else f"only {ours} by webhook"
        found.append(Detection(
            "missing_webhook",
            f"the provider reports {record.status} ({record.outcome}) for {local.subject} "
            f"{local.reference}; {known}; recovered through the API", record.amount, facts))
    elif ours != record.outcome:
        # a recovered state came from no webhook but from the provider's earlier answer
        said = (f"an earlier check recovered {local.status} ({ours}), the provider now says"
                if local.recovered else
                f"webhooks say {local.status} ({ours}), the provider says")
        found.append(Detection(
            "status_mismatch", f"{said} {record.status} ({record.outcome})",
            _risk(local.amount, record.amount), facts))
    elif (local.amount is not None and record.amount is not None
          and local.amount != record.amount):
        found.append(Detection(
            "amount_mismatch",
            f"webhooks say {_tzs(local.amount)} TZS, the provider says "
            f"{_tzs(record.amount)} TZS",
            _apart(local.amount, record.amount), {**facts, "basis": "webhook"}))
    if (record.outcome == "success" and local.expected_amount is not None
            and record.amount is not None and record.amount != local.expected_amount
            and not any(d.kind == "amount_mismatch" for d in found)):
        found.append(Detection(
            "amount_mismatch",
            f"{_tzs(record.amount)} TZS paid of {_tzs(local.expected_amount)} TZS expected",
            _apart(local.expected_amount, record.amount),
            {**facts, "basis": "expectation",
             "expected_amount": _tzs(local.expected_amount)}))
    status_differs = any(d.kind == "status_mismatch" for d in found)
    mismatch = status_differs or any(d.kind == "amount_mismatch" for d in found)
    if not mismatch:
        # a recovered state is the provider's own answer: a check agreeing with it says
        # nothing about a webhook that contradicted it (conflicting_events stays open)
        agreed = ("status_mismatch", "amount_mismatch") + (
            () if local.recovered else ("conflicting_events",))
        resolve += [(d.id, "a check agrees with the provider") for d in local.open
                    if d.kind in agreed]
    elif not status_differs:
        # the states agree now (or do once this check's recovery is folded) and only the
        # amount differs: that is an amount_mismatch's to carry, with the difference at
        # risk, not the whole amount. A recovered state was once left out: its open
        # status_mismatch stayed beside the amount_mismatch, and once a person resolved
        # that, the subject counted as settled and it was never closed
        reason = ("the provider's state is recovered" if recover is not None
                  else "a check agrees with the provider on the state")
        resolve += [(d.id, reason) for d in local.open if d.kind == "status_mismatch"]
    result = "recovered" if recover else "mismatch" if mismatch else "agrees"
    # a mismatch a person resolved, found again unchanged, is settled: asked about again
    # when the row changes (and by the refund re-check), not every backoff for ever
    dismissed = _dismissed(local)
    looked_at = all((d.kind, same_amounts(d.detail)) in dismissed for d in found
                    if d.kind in ("status_mismatch", "amount_mismatch"))
    return _verdict(result, recover, found, resolve, local, settled=looked_at)


def _claims(facts: Mapping[str, Any]) -> tuple[Any, Any]:
    """What makes a finding of a kind news: the provider's outcome and, for a subject the
    provider denies knowing, what its webhooks say. An ``unknown_at_provider`` found before
    any webhook came stayed open as it was when a webhook then called the payment paid:
    "the initiation most likely failed", at the expected amount, while the payments view
    said success and the warning not to fulfil it was never given."""
    return facts.get("provider_outcome"), facts.get("webhook_outcome")


def _superseded(found: Detection) -> str:
    outcome = found.facts.get("provider_outcome")
    if outcome is None and found.kind == "unknown_at_provider":
        said = found.facts.get("webhook_outcome")
        return f"superseded: its webhooks now say {said or 'nothing'}"
    return f"superseded: the provider now reports {outcome or 'another record'}"


def _verdict(result: str, recover: ProviderRecord | None, found: Sequence[Detection],
             resolve: Sequence[tuple[str, str]], local: Local, *, settled: bool) -> Verdict:
    """Drop what a person resolved and what is already open with the same provider
    outcome (and, for a subject the provider denies, the same webhooks' outcome); a finding
    whose outcome changed supersedes the open ones of its kind (resolved here, each with
    its reason)."""
    opened = local.open
    dismissed = _dismissed(local)
    fresh: list[Detection] = []
    reasons: list[tuple[str, str]] = list(resolve)
    for found_one in found:
        same_kind = [o for o in opened if o.kind == found_one.kind]
        said = _claims(found_one.facts)
        superseded = _superseded(found_one)
        if (found_one.kind, same_amounts(found_one.detail)) in dismissed:
            # opens nothing; what is open of its kind closes as a fresh finding would close
            # it, and a copy of it (reopened before the person's resolution was kept) too
            reasons += [(o.id, "a person resolved the same finding") for o in same_kind
                        if same_amounts(o.detail) == same_amounts(found_one.detail)]
            reasons += [(o.id, superseded) for o in same_kind if _claims(o.facts) != said]
            continue
        if any(_claims(o.facts) == said for o in same_kind):
            continue
        fresh.append(found_one)
        reasons += [(o.id, superseded) for o in same_kind]
    first_reason: dict[str, str] = {}
    for discrepancy_id, reason in reasons:
        first_reason.setdefault(discrepancy_id, reason)
    return Verdict(result, recover, tuple(fresh), tuple(first_reason.items()), settled)


# a number with a fraction or a short exponent in a finding's text (1000.00, 1E+3); plain
# integers are left as written (``INV-00100`` stays itself), and so is an exponent of three
# digits or more, whose digits written out could take gigabytes (the text holds the
# provider's status word and references, not only amounts, which are bounded)
_DECIMAL = re.compile(
    r"(?<![\w.])\d+(?:\.\d+(?:[eE][+-]?\d{1,2})?|[eE][+-]?\d{1,2})(?![\w]|\.\d)")


def same_amounts(detail: str) -> str:
    """A finding's text with each amount in one spelling, so the provider writing 1000 one
    day and 1000.00 (or 1E+3) the next, or a numeric column's own scale, is not news. Exact:
    no rounding, however many places (``Decimal.normalize`` rounds to its context's 28
    digits, which would make two different amounts one)."""
    def one_spelling(match: re.Match[str]) -> str:
        text = format(Decimal(match.group(0)), "f")
        return text.rstrip("0").rstrip(".") if "." in text else text
    return _DECIMAL.sub(one_spelling, detail)


def _dismissed(local: Local) -> frozenset[tuple[str, str]]:
    return frozenset((kind, same_amounts(detail)) for kind, detail in local.dismissed)


def settle(kind: str, facts: Mapping[str, Any], row: Mapping[str, Any] | None) -> str | None:
    """Why an open discrepancy is resolved by the current projection row, or None."""
    if row is None:
        return None
    if kind == "unsettled_paid_invoice":
        return "the invoice is now settled" if row.get("settled") else None
    if kind == "cancelled_invoice_paid":
        received = row.get("amount_paid")
        return ("the money received was refunded"
                if received is not None and Decimal(str(received)) == 0 else None)
    outcome = row.get("outcome")
    if kind == "unresolved":
        return "a final state arrived" if outcome in TERMINAL else None
    provider_outcome = facts.get("provider_outcome")
    if row.get("recovered") or provider_outcome is None:
        return None
    later = SUCCESSORS.get(str(row.get("subject")), {}).get(str(provider_outcome), frozenset())
    if kind == "missing_webhook" and outcome in later:
        # the lost webhook's state is past: a later webhook (a refund after the success
        # found) moved the row on, and "fulfil" must not stay open beside it
        return f"a later webhook moved it on to {outcome}"
    if outcome != provider_outcome:
        return None
    if kind == "missing_webhook":  # its amount, if it differs, is an amount_mismatch's
        return "the late webhook arrived and agrees"
    if kind == "status_mismatch":  # likewise
        return "a later webhook agrees with the provider"
    if kind == "amount_mismatch" and facts.get("basis") != "expectation":
        # (the provider paid other than expected: no webhook can change that, a check can)
        wanted, amount = facts.get("provider_amount"), row.get("amount")
        if wanted is None or amount is None or Decimal(str(wanted)) != Decimal(str(amount)):
            return None
        return "a later webhook agrees with the provider"
    return None
