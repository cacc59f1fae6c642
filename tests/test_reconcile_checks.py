"""Pure decisions and parsing, with property tests where arbitrary input matters."""

from __future__ import annotations

import dataclasses
import json
import random
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingest.codes import CODES
from ingest.codes import outcome as webhook_outcome
from reconcile.checks import Local, OpenDiscrepancy, decide, same_amounts, settle
from reconcile.client import Lookup, backoff_delay, parse_envelope, retry_after_seconds
from reconcile.errors import MalformedEnvelope, MappingError
from reconcile.findings import recovered_event
from reconcile.records import PAYMENT_EVENTS, ProviderRecord, RecordMapping, record_outcome

NOW = datetime(2026, 11, 22, 12, tzinfo=UTC)
WINDOW = timedelta(seconds=90)
ZONE = ZoneInfo("Africa/Dar_es_Salaam")
OUTCOMES = st.sampled_from([None, "success", "failure", "refunded", "pending"])
AMOUNTS = st.one_of(st.none(), st.decimals(min_value=0, max_value=10**9, places=2))
STATUS = {"success": "SUCCESSFUL", "failure": "FAILED", "refunded": "REFUNDED",
          "pending": "PENDING"}


def record(outcome: str, amount: Decimal | None) -> ProviderRecord:
    return ProviderRecord("R", STATUS[outcome], amount, None, None, None, None, None, None)


@given(ours=OUTCOMES, theirs=st.sampled_from(["success", "failure", "refunded", "pending"]),
       local_amount=AMOUNTS, provider_amount=AMOUNTS, subject=st.sampled_from(
           ["collection", "payout"]), age=st.integers(0, 10_000),
       opened_outcomes=st.lists(OUTCOMES, min_size=3, max_size=3))
def test_a_verdict_never_recovers_over_a_contradicting_webhook_and_never_reopens(
        ours: str | None, theirs: str, local_amount: Decimal | None,
        provider_amount: Decimal | None, subject: str, age: int,
        opened_outcomes: list[str | None]) -> None:
    opened = tuple(
        OpenDiscrepancy(f"id-{k}", k, {} if o is None else {"provider_outcome": o})
        for k, o in zip(("status_mismatch", "unresolved", "missing_webhook"), opened_outcomes,
                        strict=True))
    local = Local(subject, "R", ours, None, local_amount, since=NOW - timedelta(seconds=age),
                  open=opened)
    verdict = decide(local, Lookup("R", "found", record(theirs, provider_amount)), now=NOW,
                     window=WINDOW)
    if verdict.recover is not None:
        assert ours in (None, "pending") or (subject, ours, theirs) == (
            "collection", "success", "refunded")
        assert theirs != "pending"
        # whatever is recovered can be written as a webhook-shaped event
        assert recovered_event(subject, verdict.recover, "p", NOW, ZONE).facts["event"]
    if ours in ("success", "failure", "refunded") and ours != theirs and theirs != "pending":
        resolved = {discrepancy_id for discrepancy_id, _ in verdict.resolve}
        still_open = {o.kind for o in opened if o.id not in resolved}
        kinds = {d.kind for d in verdict.detect} | still_open
        assert "status_mismatch" in kinds or verdict.recover is not None
    # a kind already open is found again only when the provider's outcome changed, and
    # then the open one is resolved as superseded: never two open of one kind
    resolved = {discrepancy_id for discrepancy_id, _ in verdict.resolve}
    for d in verdict.detect:
        for o in opened:
            if o.kind == d.kind:
                assert o.facts.get("provider_outcome") != d.facts.get("provider_outcome")
                assert o.id in resolved
    for d in verdict.detect:
        assert d.amount_at_risk is None or d.amount_at_risk >= 0
    assert not (verdict.resolve and verdict.result == "error")


@given(kind=st.sampled_from(["missing_webhook", "status_mismatch", "amount_mismatch",
                             "unresolved", "conflicting_events"]), outcome=OUTCOMES,
       recovered=st.booleans())
def test_settle_never_resolves_on_a_recovered_state_except_unresolved(
        kind: str, outcome: str | None, recovered: bool) -> None:
    facts = {"provider_outcome": "success", "provider_amount": "10"}
    reason = settle(kind, facts, {"outcome": outcome, "amount": Decimal(10),
                                  "recovered": recovered})
    if recovered and kind != "unresolved":
        assert reason is None
    if kind == "conflicting_events":
        assert reason is None


def test_a_refund_webhook_after_a_recovered_success_settles_its_missing_webhook() -> None:
    """The success was recovered (its webhook lost for good: the general system never
    resends), and its missing_webhook said "fulfil"; then the refund's own webhook came.
    The row moved on to refunded, the provider agrees, and the subject is settled, so no
    check would ever close the finding that still told someone to deliver goods for money
    that went back, the whole amount at risk."""
    facts = {"provider_outcome": "success", "provider_amount": "10"}
    refunded = {"subject": "collection", "outcome": "refunded", "amount": Decimal(10),
                "recovered": False}
    reason = settle("missing_webhook", facts, refunded)
    assert reason is not None and "refunded" in reason
    # only a state that follows the one found: not a failure, not one recovered, and
    # nothing follows a payout's
    assert settle("missing_webhook", facts, {**refunded, "outcome": "failure"}) is None
    assert settle("missing_webhook", facts, {**refunded, "recovered": True}) is None
    assert settle("missing_webhook", facts, {**refunded, "subject": "payout"}) is None
    assert settle("missing_webhook", {"provider_outcome": "failure"}, refunded) is None


def test_a_refund_found_after_a_recovered_success_supersedes_its_open_finding() -> None:
    """The success was recovered (its webhook lost) and its missing_webhook is still open,
    telling someone to fulfil; the provider now says the money went back. That must be a
    finding of its own, and the one that says "fulfil" must not stay open beside it."""
    success = OpenDiscrepancy("id-s", "missing_webhook", {"provider_outcome": "success"})
    local = Local("collection", "R", "success", "SUCCESSFUL", Decimal(10), recovered=True,
                  since=NOW - timedelta(hours=6), open=(success,))
    verdict = decide(local, Lookup("R", "found", record("refunded", Decimal(10))), now=NOW,
                     window=WINDOW)
    assert verdict.result == "recovered" and verdict.recover is not None
    [found] = verdict.detect
    assert found.kind == "missing_webhook" and found.facts["provider_outcome"] == "refunded"
    assert found.amount_at_risk == Decimal(10)
    assert dict(verdict.resolve) == {"id-s": "superseded: the provider now reports refunded"}
    # once the refund's finding is the open one, asking again opens nothing more
    refund = OpenDiscrepancy("id-r", "missing_webhook", {"provider_outcome": "refunded"})
    again = dataclasses.replace(local, outcome="refunded", status="REFUNDED", open=(refund,))
    verdict = decide(again, Lookup("R", "found", record("refunded", Decimal(10))), now=NOW,
                     window=WINDOW)
    assert verdict.detect == () and verdict.resolve == ()


def test_a_record_of_another_kind_that_becomes_this_ones_resolves_that_finding() -> None:
    """Reported as "not a collection, nothing recovered"; the record is a part payment now.
    The state is recovered and the short payment reported; the stale finding must go."""
    other = OpenDiscrepancy("id-k", "status_mismatch", {"provider_kinds": "invoice"})
    local = Local("collection", "R", since=NOW - timedelta(hours=1),
                  expected_amount=Decimal(1500), open=(other,))
    paid = kinded("payment.confirmed", 91001, "Collection", "CHARGE")
    paid = dataclasses.replace(paid, status="PARTIAL", amount=Decimal(500))
    verdict = decide(local, Lookup("R", "found", paid), now=NOW, window=WINDOW)
    assert verdict.recover is not None
    assert sorted(d.kind for d in verdict.detect) == ["amount_mismatch", "missing_webhook"]
    assert dict(verdict.resolve) == {"id-k": "the provider's record is now a collection"}


def test_a_check_agreeing_with_a_recovered_state_leaves_a_contradicting_webhook_flagged() -> None:
    """The recovered state is the provider's own answer: asking again proves nothing about
    the late webhook that contradicted it. A webhook-kept state the provider confirms does
    settle a conflict between webhooks."""
    conflict = (OpenDiscrepancy("id-c", "conflicting_events"),)
    answer = Lookup("R", "found", record("success", Decimal(10)))
    for recovered, resolved in ((True, ()), (False, ("id-c",))):
        local = Local("collection", "R", "success", "SUCCESSFUL", Decimal(10),
                      recovered=recovered, since=NOW - timedelta(hours=1), open=conflict)
        verdict = decide(local, answer, now=NOW, window=WINDOW)
        assert verdict.result == "agrees"
        assert tuple(i for i, _ in verdict.resolve) == resolved


def test_an_error_decides_nothing_and_a_missing_record_is_unknown_only_after_the_window() -> None:
    local = Local("collection", "R", since=NOW - timedelta(seconds=10), expected_amount=Decimal(5))
    assert decide(local, Lookup("R", "error", error="timeout"), now=NOW, window=WINDOW
                  ).detect == ()
    assert decide(local, Lookup("R", "not_found"), now=NOW, window=WINDOW).detect == ()
    late = decide(local, Lookup("R", "not_found"), now=NOW + WINDOW, window=WINDOW)
    assert [d.kind for d in late.detect] == ["unknown_at_provider"]


@pytest.mark.parametrize(("outcome", "status", "recovered", "said"), [
    ("success", "SUCCESSFUL", False,
     "; yet its webhooks said success (SUCCESSFUL): do not fulfil or pay on it until the "
     "provider confirms"),
    ("failure", "FAILED", False, "; yet its webhooks said failure (FAILED)"),
    ("success", None, True, "; its recovered record said success: do not fulfil or pay on "
                            "it until the provider confirms"),
    (None, None, False, ""),
])
def test_a_subject_the_provider_denies_says_what_its_webhooks_claimed(
        outcome: str | None, status: str | None, recovered: bool, said: str) -> None:
    """A paid webhook for a payment the provider never had (forged, misdirected) read as
    an initiation that failed, advice and all, while the payments view said success."""
    for subject in ("collection", "payout"):
        local = Local(subject, "FORGED-1", outcome=outcome, status=status, recovered=recovered,
                      amount=Decimal(250000), since=NOW - WINDOW)
        [found] = decide(local, Lookup("FORGED-1", "not_found"), now=NOW, window=WINDOW).detect
        assert found.kind == "unknown_at_provider"
        assert found.detail == f"the provider has no record of {subject} FORGED-1{said}"
        assert found.facts.get("webhook_outcome") == outcome
        assert found.amount_at_risk == Decimal(250000)


@given(st.binary(max_size=200))
def test_any_bytes_give_an_envelope_or_malformed_envelope(raw: bytes) -> None:
    try:
        envelope = parse_envelope(raw)
    except MalformedEnvelope:
        return
    assert isinstance(envelope.data, dict)


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda inner: st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12))
def test_any_data_maps_to_a_record_or_a_mapping_error(data: object) -> None:
    mapping = RecordMapping.create({"status": "payment.state"})
    try:
        mapped = mapping.read(data if isinstance(data, dict) else {"x": data}, "R")
    except MappingError:
        return
    assert mapped.outcome in ("success", "failure", "refunded", "pending")


@pytest.mark.parametrize("code", [2**31, -2**31 - 1, 9100000055, 123456789012345678901])
def test_a_code_no_integer_column_holds_is_refused_in_the_record_and_the_envelope(
        code: int) -> None:
    """Kept, such a code was stored wrapped round in ``payments.code`` and read back from
    ``facts`` by orjson as a float (or not at all), so live and rebuilt views differed and
    the report's cast failed; it says nothing a 9SOO code could."""
    mapping = RecordMapping.create({})
    with pytest.raises(MappingError, match="code is out of range"):
        mapping.read({"reference": "R", "status": "SUCCESSFUL", "code": code}, "R")
    assert mapping.read({"reference": "R", "code": 2**31 - 1}, "R").code == 2**31 - 1
    with pytest.raises(MalformedEnvelope, match="out of range"):
        parse_envelope(b'{"success": true, "code": %d, "message": "", "data": {}}' % code)


@pytest.mark.parametrize("written", ["91055.0", "9.1055e4", "91055.000"])
def test_a_records_code_written_with_a_zero_fraction_is_that_code(written: str) -> None:
    """JSON has one number type, and the client reads a number with a point as a Decimal:
    a failure's record whose code came as 91055.0 was a mapping error every pass, never
    recovered, as the same code in a webhook is read (ingest.general_body)."""
    data = json.loads(f'{{"reference": "R", "code": {written}, "amount": 0}}',
                      parse_float=Decimal)
    got = RecordMapping.create({}).read(data, "R")
    assert (got.code, got.outcome) == (91055, "failure")
    with pytest.raises(MappingError, match="code is not an integer"):
        RecordMapping.create({}).read({"reference": "R", "code": Decimal("91055.5")}, "R")


@pytest.mark.parametrize("written", ["0.0E+30", "0E-200", "0e20", "0E-20000"])
def test_a_records_amount_of_zero_is_zero_whatever_its_spelling(written: str) -> None:
    """The range check read the exponent of nothing: a failure's record with such an
    amount was a mapping error every pass. Past the places a column takes it is plain 0:
    recovered as 0E-20000 it failed the projector's every batch from then on."""
    data = json.loads(f'{{"reference": "R", "code": 91055, "amount": {written}}}',
                      parse_float=Decimal)
    amount = RecordMapping.create({}).read(data, "R").amount
    assert amount == 0 and amount is not None and len(format(amount, "f")) <= 102


def test_the_mapping_follows_dotted_paths_and_the_outcome_follows_the_code_band() -> None:
    mapping = RecordMapping.create({"status": "payment.state", "amount": "payment.paid"})
    got = mapping.read({"payment": {"state": "PAID", "paid": Decimal("12.50")},
                        "transactionId": "-1"}, "R")
    assert (got.status, got.amount, got.transaction_id) == ("PAID", Decimal("12.50"), None)
    assert record_outcome("payment.confirmed", 91099, "SUCCESSFUL") == "failure"
    assert record_outcome(None, None, "USER_REJECTED") == "failure"


@pytest.mark.parametrize(("code", "status", "expected"), [
    (91000, "COMPLETE", "success"), (91001, "PARTIALLY_PAID", "success"),
    (91010, "SUCCESSFUL", "refunded"), (92000, "DONE", "success"),
    (92002, "SUCCESSFUL", "pending"), (91052, "SUCCESSFUL", "failure"),
])
def test_a_listed_code_decides_before_the_operators_word(code: int, status: str,
                                                         expected: str) -> None:
    """Status words are the operator's verbatim and can never be listed in full: a record
    with no event but a listed code is read by the code."""
    assert record_outcome(None, code, status) == expected


@pytest.mark.parametrize(("event", "code", "status"), [
    (None, 1051, "SUCCESSFUL"), ("payment.confirmed", 1051, None), (None, 250, "PAID"),
    (None, 100051, "SUCCESSFUL"),
])
def test_a_code_of_no_webhook_event_says_nothing_about_the_outcome(
        event: str | None, code: int, status: str | None) -> None:
    """The failure band (``code % 100 >= 50``) is the five-digit webhook event codes' (9 S
    OO); read into any other code a record carries (an operator's, say), a lost success
    was recovered as a failure."""
    assert record_outcome(event, code, status) == "success"


@given(event=st.sampled_from(sorted(PAYMENT_EVENTS)),
       code=st.none() | st.sampled_from(sorted(CODES)) | st.integers(90000, 99999),
       status=st.none() | st.sampled_from(["SUCCESSFUL", "FAILED", "REFUNDED", "PENDING"]))
def test_a_record_and_a_webhook_with_the_same_fields_get_the_same_outcome(
        event: str, code: int | None, status: str | None) -> None:
    """Otherwise a check calls a webhook-kept state a status_mismatch that is not one."""
    assert record_outcome(event, code, status) == webhook_outcome(event, code)


@given(st.integers(1, 30), st.floats(0.01, 2), st.floats(0.01, 60))
def test_backoff_is_jittered_within_its_exponential_cap(attempt: int, base: float,
                                                        cap: float) -> None:
    delay = backoff_delay(attempt, base_s=base, cap_s=cap, rng=random.Random(attempt))
    assert 0 <= delay <= min(cap, base * 2 ** (attempt - 1))


def test_retry_after_is_read_as_seconds_or_a_date_and_capped() -> None:
    assert retry_after_seconds("2") == 2.0
    assert retry_after_seconds("99999") == 30.0
    assert retry_after_seconds("Sun, 22 Nov 2026 12:00:05 GMT", now=NOW.timestamp()) == 5.0
    assert retry_after_seconds("soon") is None
    assert retry_after_seconds("\u00b2") is None  # a digit to str.isdigit, not to float


@pytest.mark.parametrize("zone", ["UTC", "America/New_York", "Pacific/Kiritimati"])
@pytest.mark.parametrize("date", [
    "Sunday, 22-Nov-26 12:00:05 GMT",  # RFC 850, obsolete but to be accepted
    "Sun Nov 22 12:00:05 2026",  # asctime: no zone written, GMT all the same
    "Sun, 22 Nov 2026 12:00:05 -0000",  # RFC 5322's "UTC, but the sender's zone unknown"
])
def test_retry_after_dates_are_gmt_whatever_the_process_time_zone(
        zone: str, date: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An HTTP date is in GMT in each of its three forms (RFC 9110, 5.6.7). Those that
    write no zone were read in the process's local time: with ``TZ`` east of UTC a 429's
    ``Retry-After`` was past already and the next lookup went at once, into the same limit;
    west of it, the pause was the cap whatever the provider asked."""
    monkeypatch.setenv("TZ", zone)
    time.tzset()
    try:
        assert retry_after_seconds(date, now=NOW.timestamp()) == 5.0
    finally:
        monkeypatch.undo()
        time.tzset()


def test_backoff_never_overflows_however_many_attempts_are_allowed() -> None:
    """HOOKLEDGER_API_MAX_ATTEMPTS has no upper bound: attempt 1,100 raised OverflowError."""
    assert 0 <= backoff_delay(1_100, base_s=0.5, cap_s=8.0, rng=random.Random(1)) <= 8.0


def kinded(event: str | None = None, code: int | None = None, service: str | None = None,
           type_: str | None = None) -> ProviderRecord:
    return ProviderRecord("R", "SUCCESSFUL", Decimal(100), event, code, None, None, service,
                          None, type=type_)


@pytest.mark.parametrize(("fields", "subject", "told_by"), [
    ({"event": "payment.confirmed", "code": 91000, "service": "Collection",
      "type_": "CHARGE"}, "collection", None),
    ({"event": "payment.confirmed", "code": 91000, "service": "Collection",
      "type_": "CHARGE"}, "payout", "event"),
    ({"event": "payout.failed", "code": 92055, "service": "Disbursement", "type_": "PAYOUT"},
     "payout", None),
    ({"event": "payout.failed", "code": 92055, "service": "Disbursement", "type_": "PAYOUT"},
     "collection", "event"),
    # a part payment against an invoice is a collection that may name Invoicing: the event
    # and the code speak for a record, service and type only without them
    ({"event": "payment.confirmed", "code": 91001, "service": "Invoicing", "type_": "CHARGE"},
     "collection", None),
    ({"event": "payment.refunded", "code": 91010, "type_": "PAYOUT"}, "collection", None),
    ({"code": 92050, "service": "Collection"}, "payout", None),
    # without them, Invoicing is an invoice: nothing else could tell its total from a payment
    ({"service": "Invoicing", "type_": "CHARGE"}, "collection", "service"),
    ({"event": "invoice.paid", "code": 93002, "service": "Invoicing"}, "collection", "event"),
    ({"event": "sms.delivered", "code": 94000, "service": "Bulk SMS"}, "collection", "event"),
    # each field on its own, as a provider whose records hold only some of them
    ({"code": 92000}, "collection", "code"),
    ({"code": 91050}, "payout", "code"),
    ({"service": " disbursement "}, "collection", "service"),
    ({"service": "Invoicing"}, "payout", "service"),
    ({"type_": "payout"}, "collection", "type"),
    ({"type_": "CHARGE"}, "payout", "type"),
    # a field holding what no rule knows, or nothing at all, says nothing
    ({"type_": "DISBURSEMENT", "service": "Wallet", "event": "transfer.done", "code": 12345},
     "collection", None),
    ({}, "payout", None),
    # a chat record carries no code; an event name in capitals is the same event
    ({"event": "chat.message.failed"}, "collection", "event"),
    ({"event": "PAYOUT.CONFIRMED", "service": "Collection"}, "collection", "event"),
    # the fields disagreeing among themselves: not this kind either way
    ({"event": "payment.confirmed", "code": 92000}, "collection", "code"),
])
def test_a_record_says_which_kind_it_is_by_any_field_that_can_tell(
        fields: dict[str, Any], subject: str, told_by: str | None) -> None:
    said = kinded(**fields).not_a(subject)
    if told_by is None:
        assert said is None
    else:
        assert said is not None and said.field == told_by
        assert str(said).startswith(f"its {told_by} ") and subject not in said.kinds


KIND_FIELDS = {
    "collection": {"event": ["payment.confirmed", "payment.failed", "payment.refunded"],
                   "code": [91000, 91001, 91010, 91050], "service": ["Collection"],
                   "type_": ["CHARGE"]},
    "payout": {"event": ["payout.approved", "payout.confirmed", "payout.failed"],
               "code": [92000, 92002, 92050], "service": ["Disbursement"],
               "type_": ["PAYOUT"]},
}


@given(kind=st.sampled_from(["collection", "payout"]), data=st.data())
def test_a_consistent_record_is_its_own_kind_and_never_the_other(
        kind: str, data: st.DataObject) -> None:
    """Any subset of fields, each a value the spec gives that kind: it is that kind, and
    is told apart from the other kind as soon as one field is there."""
    fields = {name: data.draw(st.none() | st.sampled_from(values), label=name)
              for name, values in KIND_FIELDS[kind].items()}
    record = kinded(**fields)
    other = "payout" if kind == "collection" else "collection"
    assert record.not_a(kind) is None
    assert (record.not_a(other) is None) == all(v is None for v in fields.values())


def test_a_record_of_another_kind_is_never_recovered_and_no_webhook_settles_it() -> None:
    collection_record = kinded("payment.confirmed", 91000, "Collection", "CHARGE")
    local = Local("payout", "R", "pending", "APPROVED", Decimal(100), since=NOW - WINDOW * 2)
    verdict = decide(local, Lookup("R", "found", collection_record), now=NOW, window=WINDOW)
    # not settled: the record may yet become the payout's, its webhook lost, so it is asked
    # about again after the backoff
    assert verdict.recover is None and verdict.result == "mismatch" and not verdict.settled
    [found] = verdict.detect
    assert found.kind == "status_mismatch" and "is not a payout" in found.detail
    assert found.amount_at_risk == Decimal(100)
    for outcome in ("success", "failure", "pending"):  # whatever the payout's webhooks say
        assert settle(found.kind, found.facts, {"outcome": outcome, "amount": Decimal(100),
                                                "recovered": False}) is None
    # once a person resolved it, the same other kind is not reported again
    looked_at = dataclasses.replace(local, looked_at_kinds=frozenset({"collection"}))
    again = decide(looked_at, Lookup("R", "found", collection_record), now=NOW, window=WINDOW)
    assert again.detect == () and again.recover is None and not again.settled
    # another kind of record under the reference is news, and is reported
    sms_record = kinded("sms.delivered", 94000, "Bulk SMS")
    other = decide(looked_at, Lookup("R", "found", sms_record), now=NOW, window=WINDOW)
    assert [d.kind for d in other.detect] == ["status_mismatch"]


def test_a_type_that_is_not_text_loses_the_hint_not_the_lookup() -> None:
    """``type`` is read only as a hint of the record's kind: a provider that puts an object
    there must not make every lookup a mapping error."""
    data = {"reference": "R", "status": "SUCCESSFUL", "amount": 100, "type": {"mode": "x"}}
    read = RecordMapping.create().read(data, "R")
    assert read.type is None and read.outcome == "success"
    assert RecordMapping.create().read({**data, "type": "PAYOUT"}, "R").type == "PAYOUT"


def test_what_the_ledger_cannot_keep_never_leaves_the_mapping() -> None:
    """A NUL or half an emoji in a text, or an amount past numeric: refused by the
    mapping, since kept they failed the append of every answer checked beside them."""
    mapping = RecordMapping.create()
    for field, value in [("customerReference", "order\x007"), ("status", "PAID \ud83d"),
                         ("amount", Decimal("1E+16")), ("amount", "1E-101"),
                         ("amount", "1e99999999999999999999")]:
        with pytest.raises(MappingError, match=r"cannot keep|out of range|not a number"):
            mapping.read({"reference": "R", field: value}, "R")
    assert mapping.read({"reference": "R", "status": "PAID", "type": "PAY\x00OUT"},
                        "R").type is None
    for fine in (Decimal("9999999999999999.5"), Decimal("1E-16"), Decimal("0E-20")):
        assert mapping.read({"reference": "R", "code": 91000, "amount": fine},
                            "R").amount == fine


def test_an_envelope_keeps_its_message_storable_and_reads_any_exponent() -> None:
    envelope = parse_envelope(
        b'{"success": false, "code": 1404, "message": "no \\u0000such \\ud800", "data": '
        b'{"amount": 1e99999999999999999999}}')
    assert envelope.message == "no \\u0000such \\ud800"
    assert envelope.data["amount"] == "1e99999999999999999999"


def test_a_recovered_state_the_provider_now_contradicts_is_not_blamed_on_webhooks() -> None:
    """No webhook ever came: the state was the provider's own earlier answer. The finding
    said "webhooks say FAILED", sending a person to look for a webhook that never was."""
    local = Local("collection", "R", "failure", "FAILED", Decimal(10), recovered=True,
                  since=NOW - timedelta(hours=6))
    verdict = decide(local, Lookup("R", "found", record("success", Decimal(10))), now=NOW,
                     window=WINDOW)
    [found] = verdict.detect
    assert found.kind == "status_mismatch" and verdict.recover is None
    assert "webhook" not in found.detail
    assert "recovered" in found.detail and "FAILED" in found.detail
    assert "SUCCESSFUL" in found.detail
    by_webhook = decide(Local("collection", "R", "failure", "FAILED", Decimal(10),
                              since=NOW - timedelta(hours=6)),
                        Lookup("R", "found", record("success", Decimal(10))), now=NOW,
                        window=WINDOW)
    assert by_webhook.detect[0].detail.startswith("webhooks say FAILED")


@given(kind_and_answer=st.sampled_from([
    ("amount_mismatch", ("success", Decimal(1000), Decimal(1500), "success", Decimal(1000))),
    ("status_mismatch", ("success", Decimal(1000), None, "failure", Decimal(1000))),
    ("unresolved", (None, None, Decimal(700), "pending", Decimal(700))),
]), dismissed_detail=st.booleans(), other_detail=st.text(max_size=5))
def test_a_finding_a_person_resolved_is_not_found_again_unless_it_changed(
        kind_and_answer: tuple[str, tuple[Any, ...]], dismissed_detail: bool,
        other_detail: str) -> None:
    kind, (ours, amount, expected, theirs, provider_amount) = kind_and_answer
    local = Local("collection", "R", ours, None if ours is None else STATUS[ours], amount,
                  recovered=ours is not None, since=NOW - timedelta(hours=1),
                  expected_amount=expected)
    lookup = Lookup("R", "found", record(theirs, provider_amount))
    [first] = decide(local, lookup, now=NOW, window=WINDOW).detect
    assert first.kind == kind
    detail = first.detail if dismissed_detail else first.detail + "!" + other_detail
    again = decide(dataclasses.replace(local, dismissed=frozenset({(kind, detail)})), lookup,
                   now=NOW, window=WINDOW)
    assert [d.kind for d in again.detect] == ([] if dismissed_detail else [kind])
    # a mismatch a person looked at is settled (asked again when its row changes, not every
    # backoff); a payment still pending at the provider is asked about until it resolves
    assert again.settled is (dismissed_detail and kind != "unresolved")
    assert again.resolve == ()  # dismissed is not agreed: nothing open is resolved by it


@given(paid=st.integers(min_value=0, max_value=10**9),
       first_zeros=st.integers(min_value=0, max_value=3),
       later_zeros=st.integers(min_value=0, max_value=3),
       local_zeros=st.integers(min_value=0, max_value=3))
def test_a_finding_a_person_resolved_is_the_same_whatever_the_amounts_spelling(
        paid: int, first_zeros: int, later_zeros: int, local_zeros: int) -> None:
    """The provider may write 1000 one day and 1000.00 the next (a numeric column gives
    its own scale too): the same money is the same finding, not news that reopens it."""
    def spelt(value: int, zeros: int) -> Decimal:
        return Decimal(value).quantize(Decimal(1).scaleb(-zeros)) if zeros else Decimal(value)
    expected = spelt(paid + 500, local_zeros)
    local = Local("collection", "R", "success", "SUCCESSFUL", spelt(paid, local_zeros),
                  since=NOW - timedelta(hours=1), expected_amount=expected)
    [first] = decide(local, Lookup("R", "found", record("success", spelt(paid, first_zeros))),
                     now=NOW, window=WINDOW).detect
    looked = dataclasses.replace(local, dismissed=frozenset({(first.kind, first.detail)}))
    again = decide(looked, Lookup("R", "found", record("success", spelt(paid, later_zeros))),
                   now=NOW, window=WINDOW)
    assert again.detect == () and again.settled
    other = decide(looked, Lookup("R", "found", record("success", spelt(paid + 1, later_zeros))),
                   now=NOW, window=WINDOW)
    assert [d.kind for d in other.detect] == ["amount_mismatch"]


@pytest.mark.parametrize(("one", "other", "same"), [
    ("1000.00 TZS paid of 1500 TZS expected", "1000 TZS paid of 1500.0 TZS expected", True),
    ("webhooks say 1E+3 TZS", "webhooks say 1000 TZS", True),
    ("12.50 received.", "12.5 received.", True),
    # exact: 28 significant digits are no limit to telling two amounts apart
    ("1000.000000000000000000000000001 TZS", "1000 TZS", False),
    ("0.5 TZS", "5 TZS", False),
    ("known as INV-00100", "known as INV-100", False),  # no amount: digits kept as written
])
def test_amounts_in_a_finding_are_compared_in_one_exact_spelling(one: str, other: str,
                                                                 same: bool) -> None:
    assert (same_amounts(one) == same_amounts(other)) is same


def test_a_long_exponent_in_a_finding_is_left_as_written() -> None:
    """Written out, a provider's status word ``1E+999999999`` took a gigabyte in the
    service's event loop, where webhooks are answered."""
    assert same_amounts("the provider says 1E+999999999") == "the provider says 1E+999999999"


def test_a_cancelled_invoice_paid_settles_once_the_money_went_back() -> None:
    kind = "cancelled_invoice_paid"
    assert settle(kind, {}, {"subject": "invoice", "amount_paid": Decimal("0.00")})
    assert settle(kind, {}, {"subject": "invoice", "amount_paid": Decimal(300)}) is None
    assert settle(kind, {}, {"subject": "invoice", "amount_paid": None}) is None


def _mismatch(provider: str) -> tuple[Local, Lookup]:
    local = Local("collection", "R", "success", "SUCCESSFUL", Decimal(100),
                  since=NOW - timedelta(hours=1))
    return local, Lookup("R", "found", record(provider, Decimal(100)))


def test_a_finding_a_person_resolved_still_supersedes_and_closes_its_open_copies() -> None:
    """Found again exactly as a person resolved it, a finding opens nothing, but what is
    open of its kind is closed as it would be by a fresh one: another outcome's finding is
    superseded (else it stayed open, and settled, for good), and a copy of the same finding
    (reopened by checks before the person's resolution was remembered) is closed."""
    local, failed = _mismatch("failure")
    [found] = decide(local, failed, now=NOW, window=WINDOW).detect
    stale = OpenDiscrepancy("id-x", "status_mismatch", {"provider_outcome": "refunded"},
                            "webhooks say SUCCESSFUL (success), the provider says REFUNDED")
    copy = OpenDiscrepancy("id-c", "status_mismatch", {"provider_outcome": "failure"},
                           found.detail)
    looked = dataclasses.replace(local, open=(stale, copy),
                                 dismissed=frozenset({(found.kind, found.detail)}))
    verdict = decide(looked, failed, now=NOW, window=WINDOW)
    assert verdict.detect == () and verdict.settled
    reasons = dict(verdict.resolve)
    assert reasons["id-x"].startswith("superseded")
    assert reasons["id-c"] == "a person resolved the same finding"


def test_a_reference_the_provider_spells_otherwise_still_closes_what_its_answer_settles(
        ) -> None:
    """An ``unresolved`` opened while the provider was pending is closed by the final
    answer also when that answer is the webhook's payment under another spelling (the
    status_mismatch for a person does not stop it)."""
    pending = OpenDiscrepancy("id-u", "unresolved", {"provider_outcome": "pending"})
    local = Local("collection", "CASE-1", since=NOW - timedelta(hours=1), open=(pending,),
                  known_as="case-1", expected_amount=Decimal(100))
    verdict = decide(local, Lookup("CASE-1", "found", record("success", Decimal(100))),
                     now=NOW, window=WINDOW)
    assert verdict.recover is None
    assert [d.kind for d in verdict.detect] == ["status_mismatch"]
    assert "id-u" in dict(verdict.resolve)


def test_a_records_invoice_block_is_read_as_a_webhooks_and_carried_by_its_recovery() -> None:
    """A part payment's or refund's record says what its invoice is after it. Read by the
    webhook's rules: amounts and the invoice number strictly (else the block is left out,
    and named), what only describes leniently (left out, and named)."""
    mapping = RecordMapping.create()
    data = {"reference": "R", "event": "payment.refunded", "code": 91010, "amount": 900,
            "timestamp": "20261122100000",
            "invoice": {"invoiceNo": "INV-1", "total": 900, "amountPaid": 0,
                        "amountDue": Decimal("900.00"), "currency": 834,
                        "paidDate": {"at": "x"}}}
    read = mapping.read(data, "R")
    assert read.invoice == {"invoice_no": "INV-1", "total": "900", "amount_paid": "0",
                            "amount_due": "900.00", "currency": "834", "due_date": None,
                            "paid_date": None, "payment_reference": None}
    assert read.unread_fields == ("invoice.paidDate",)
    assert read.as_json()["invoice"] == read.invoice
    assert "invoice" not in mapping.read({**data, "invoice": None}, "R").as_json()
    event = recovered_event("collection", read, "pass-1", NOW, ZONE)
    assert (event.facts["invoice"], event.facts["unread_fields"]) == (
        read.invoice, ["invoice.paidDate"])
    assert recovered_event("collection", dataclasses.replace(read, invoice=None), "pass-1",
                           NOW, ZONE).facts["invoice"] is None
    moved = RecordMapping.create({"invoice": "bill"}).read(
        {**data, "invoice": None, "bill": data["invoice"]}, "R")
    assert moved.invoice == read.invoice
    block = data["invoice"]
    assert isinstance(block, dict)
    # a block the webhook's rules cannot read costs the block (named), never the record,
    # whose payment would otherwise not be recovered at all
    for bad in [{**block, "amountPaid": "nothing"}, {**block, "amountDue": -1},
                {**block, "invoiceNo": 7}, {**block, "invoiceNo": "INV\x001"}, [block]]:
        kept = mapping.read({**data, "invoice": bad}, "R")
        assert (kept.invoice, kept.unread_fields) == (None, ("invoice",))
        assert (kept.outcome, kept.amount) == (read.outcome, read.amount)
    # amounts spelled as text, as a record's own amount may be, are read as those numbers
    spelled = mapping.read({**data, "invoice": {**block, "total": "900", "amountPaid": "0",
                                                "amountDue": " 900.00 "}}, "R")
    assert spelled.invoice == read.invoice


def test_a_refunded_invoice_payment_is_left_for_a_person() -> None:
    """No check settles it: which refund told the invoice of what (a first part refund
    with its block, a second without) is for a person to see on the invoice."""
    row = {"outcome": None, "amount": None, "recovered": False, "settled": True,
           "amount_paid": Decimal(0)}
    assert settle("refunded_invoice_payment", {}, row) is None


# -- found unpinned by mutation testing ----------------------------------------------------

def _checked(local: Local, provider: ProviderRecord | None, *, now: datetime = NOW) -> Any:
    lookup = (Lookup("R", "found", provider) if provider is not None
              else Lookup("R", "not_found"))
    return decide(local, lookup, now=now, window=WINDOW)


@pytest.mark.parametrize(("ours", "theirs"), [(700, 500), (500, 700)])
def test_a_status_mismatch_puts_the_larger_amount_at_risk(ours: int, theirs: int) -> None:
    local = Local("collection", "R", "success", "SUCCESSFUL", Decimal(ours),
                  since=NOW - timedelta(hours=1))
    [found] = _checked(local, record("failure", Decimal(theirs))).detect
    assert (found.kind, found.amount_at_risk) == ("status_mismatch", Decimal(700))


def test_the_provider_knowing_the_reference_resolves_unknown_at_provider() -> None:
    unknown = OpenDiscrepancy("id-u", "unknown_at_provider")
    local = Local("collection", "R", "success", "SUCCESSFUL", Decimal(10),
                  since=NOW - timedelta(hours=1), open=(unknown,))
    verdict = _checked(local, record("success", Decimal(10)))
    assert verdict.result == "agrees"
    assert dict(verdict.resolve) == {"id-u": "the provider now knows the reference"}


@pytest.mark.parametrize("ours", [None, "success"])
def test_a_provider_still_pending_within_the_window_is_pending_and_finds_nothing(
        ours: str | None) -> None:
    """Within the resolution window a pending answer is no news, whatever webhooks say."""
    local = Local("collection", "R", ours, None if ours is None else "SUCCESSFUL",
                  since=NOW - timedelta(seconds=10))
    verdict = _checked(local, record("pending", Decimal(10)))
    assert (verdict.result, verdict.detect, verdict.settled) == ("pending", (), False)


def test_a_provider_still_pending_after_the_window_is_unresolved_with_the_most_at_risk() -> None:
    local = Local("collection", "R", since=NOW - WINDOW, amount=Decimal(300),
                  expected_amount=Decimal(500))
    verdict = _checked(local, record("pending", Decimal(400)))
    [found] = verdict.detect
    assert verdict.result == "unresolved"
    assert (found.kind, found.amount_at_risk) == ("unresolved", Decimal(500))


@pytest.mark.parametrize(("paid", "at_risk"), [(1200, 200), (800, 200)])
def test_paid_other_than_expected_is_an_amount_mismatch_of_the_difference(
        paid: int, at_risk: int) -> None:
    """Over or under: the difference is at risk, never a negative amount."""
    local = Local("collection", "R", since=NOW - timedelta(hours=1),
                  expected_amount=Decimal(1000))
    verdict = _checked(local, record("success", Decimal(paid)))
    found = {d.kind: d for d in verdict.detect}
    assert found["amount_mismatch"].amount_at_risk == Decimal(at_risk)
    assert found["amount_mismatch"].facts["basis"] == "expectation"


@pytest.mark.parametrize("outcome", ["failure", "refunded"])
def test_only_a_success_is_held_to_its_expected_amount(outcome: str) -> None:
    """A failed (or refunded) payment received nothing to compare with what was expected."""
    local = Local("collection", "R", since=NOW - timedelta(hours=1),
                  expected_amount=Decimal(1000))
    verdict = _checked(local, record(outcome, Decimal(0)))
    assert [d.kind for d in verdict.detect] == ["missing_webhook"]


def test_states_that_agree_now_leave_only_the_amount_to_an_amount_mismatch() -> None:
    """An open status_mismatch closes once the states agree; the amount that differs is
    the amount_mismatch's to carry."""
    stale = OpenDiscrepancy("id-s", "status_mismatch", {"provider_outcome": "failure"})
    local = Local("collection", "R", "success", "SUCCESSFUL", Decimal(700),
                  since=NOW - timedelta(hours=1), open=(stale,))
    verdict = _checked(local, record("success", Decimal(500)))
    assert [(d.kind, d.amount_at_risk) for d in verdict.detect] == [
        ("amount_mismatch", Decimal(200))]
    assert dict(verdict.resolve) == {"id-s": "a check agrees with the provider on the state"}


def test_an_agreeing_check_is_settled_and_a_fresh_mismatch_is_not() -> None:
    local = Local("collection", "R", "success", "SUCCESSFUL", Decimal(10),
                  since=NOW - timedelta(hours=1))
    assert _checked(local, record("success", Decimal(10))).settled is True
    assert _checked(local, record("failure", Decimal(10))).settled is False


def test_a_finding_closed_for_several_reasons_gives_the_first() -> None:
    """A record of another kind reported, now this subject's and agreeing: closed because
    the record is this subject's now, the reason found first."""
    other = OpenDiscrepancy("id-k", "status_mismatch", {"provider_kinds": "invoice"})
    local = Local("collection", "R", "success", "SUCCESSFUL", Decimal(10),
                  since=NOW - timedelta(hours=1), open=(other,))
    verdict = _checked(local, record("success", Decimal(10)))
    assert dict(verdict.resolve) == {"id-k": "the provider's record is now a collection"}


def test_a_denied_subject_whose_webhooks_then_spoke_supersedes_its_finding() -> None:
    """Found before any webhook came; a webhook now calls it paid: a new finding with the
    warning, and the old one closed saying why."""
    before = OpenDiscrepancy("id-d", "unknown_at_provider", {})
    local = Local("collection", "R", "success", "SUCCESSFUL", Decimal(10),
                  since=NOW - timedelta(hours=1), open=(before,))
    verdict = _checked(local, None)
    [found] = verdict.detect
    assert found.facts == {"webhook_outcome": "success"}
    assert dict(verdict.resolve) == {"id-d": "superseded: its webhooks now say success"}


def test_a_reference_webhooks_brought_under_the_providers_spelling_names_it() -> None:
    local = Local("collection", "CASE-1", since=NOW - timedelta(hours=1), known_as="case-1")
    [found] = decide(local, Lookup("CASE-1", "found", record("success", Decimal(100))),
                     now=NOW, window=WINDOW).detect
    assert found.kind == "status_mismatch" and found.facts["provider_reference"] == "case-1"


@pytest.mark.parametrize("kind", ["unsettled_paid_invoice", "cancelled_invoice_paid",
                                  "unresolved", "missing_webhook", "amount_mismatch"])
def test_no_row_settles_nothing(kind: str) -> None:
    assert settle(kind, {"provider_outcome": "success"}, None) is None


def test_an_unsettled_paid_invoice_is_settled_only_by_a_settled_row() -> None:
    assert settle("unsettled_paid_invoice", {}, {"settled": True}) is not None
    assert settle("unsettled_paid_invoice", {}, {"settled": False}) is None


@pytest.mark.parametrize(("outcome", "settles"), [
    ("success", True), ("failure", True), ("refunded", True), ("pending", False), (None, False)])
def test_unresolved_is_settled_only_by_a_final_state(outcome: str | None, settles: bool) -> None:
    row = {"subject": "collection", "outcome": outcome, "recovered": False}
    assert (settle("unresolved", {"provider_outcome": "pending"}, row) is not None) is settles


def test_an_amount_mismatch_is_settled_by_a_webhook_of_the_providers_amount_in_any_spelling(
        ) -> None:
    row = {"subject": "collection", "outcome": "success", "recovered": False,
           "amount": Decimal("1000.00")}
    webhook = {"provider_outcome": "success", "provider_amount": "1000", "basis": "webhook"}
    assert settle("amount_mismatch", webhook, row) is not None
    assert settle("amount_mismatch", webhook, {**row, "amount": Decimal(999)}) is None
    # paid other than expected: no webhook can change what was paid
    assert settle("amount_mismatch", {**webhook, "basis": "expectation"}, row) is None


@pytest.mark.parametrize("paid", [1000, 800])
def test_a_recovered_state_closes_an_open_status_mismatch_whatever_the_amount(
        paid: int) -> None:
    """No webhook came, a status_mismatch was open, and the provider now reports a success
    that is recovered: the states agree once it is folded, at the expected amount or not.
    Short of it, the status_mismatch stayed open beside the amount_mismatch, and once a
    person resolved that the subject counted as settled and it stayed open for good."""
    stale = OpenDiscrepancy("id-s", "status_mismatch", {"provider_outcome": "pending"})
    local = Local("collection", "R", None, None, None, since=NOW - timedelta(hours=1),
                  expected_amount=Decimal(1000), open=(stale,))
    verdict = _checked(local, record("success", Decimal(paid)))
    assert verdict.recover is not None
    assert [d.kind for d in verdict.detect] == ["missing_webhook"] + (
        ["amount_mismatch"] if paid != 1000 else [])
    assert "id-s" in dict(verdict.resolve)


@pytest.mark.parametrize(("ours", "theirs", "expected", "detail"), [
    # a provider whose encoder strips trailing zeros (Java's BigDecimal) writes 1E+3
    (Decimal(999), Decimal("1E+3"), None, "webhooks say 999 TZS, the provider says 1000 TZS"),
    (Decimal("0.0000001"), Decimal("2E-7"), None,
     "webhooks say 0.0000001 TZS, the provider says 0.0000002 TZS"),
    (None, Decimal("1.5E+3"), Decimal("2E+3"), "1500 TZS paid of 2000 TZS expected"),
])
def test_a_findings_amounts_are_written_out_in_digits(
        ours: Decimal | None, theirs: Decimal, expected: Decimal | None, detail: str) -> None:
    """The detail is what a person reads in every report: ``1E+3 TZS`` is no amount a
    finance person reads, and ``1E-7`` none a spreadsheet keeps as text."""
    local = Local("collection", "R", None if ours is None else "success",
                  None if ours is None else "SUCCESSFUL", ours,
                  since=NOW - timedelta(hours=1), expected_amount=expected)
    verdict = _checked(local, record("success", theirs))
    assert [d.detail for d in verdict.detect if d.kind == "amount_mismatch"] == [detail]


@given(ours=st.decimals(min_value=0, max_value=Decimal("9999999999999999.999999999999999"),
                        places=15),
       theirs=st.decimals(min_value=0, max_value=Decimal("9999999999999999.999999999999999"),
                          places=15),
       basis=st.sampled_from(["webhook", "expectation"]))
def test_an_amount_mismatch_puts_the_exact_difference_at_risk(
        ours: Decimal, theirs: Decimal, basis: str) -> None:
    """Amounts as ingest and the record reader admit them (below 10**16, to 15 places and
    more): the difference was taken in Decimal's 28-digit context, and rounded."""
    if ours == theirs:
        return
    webhook = basis == "webhook"
    local = Local("collection", "R", "success" if webhook else None,
                  "SUCCESSFUL" if webhook else None, ours if webhook else None,
                  since=NOW - timedelta(hours=1), expected_amount=None if webhook else ours)
    [found] = [d for d in _checked(local, record("success", theirs)).detect
               if d.kind == "amount_mismatch"]
    assert found.amount_at_risk is not None
    assert Fraction(found.amount_at_risk) == abs(Fraction(ours) - Fraction(theirs))


@pytest.mark.parametrize("written", ["\u0661\u0660\u0660\u0660", "1_000", "\uff11\uff10\uff10"])
def test_a_records_amount_as_text_in_other_digits_is_a_mapping_error(written: str) -> None:
    """Decimal reads them (as 1000 and 100); an expectation of the same text is refused,
    and a provider that writes them is misread, not recovered at a guessed amount."""
    data = {"reference": "R", "code": 91000, "amount": written}
    with pytest.raises(MappingError, match="digits 0-9"):
        RecordMapping.create({}).read(data, "R")
    assert RecordMapping.create({}).read({**data, "amount": "1000.50"}, "R").amount == (
        Decimal("1000.50"))


@pytest.mark.parametrize("raw", [
    b'{"success": true, "code": 0, "message": "ok", "data": '
    b'{"reference": "R", "status": "FAILED", "status": "SUCCESSFUL"}}',
    b'{"success": true, "success": false, "code": 0, "message": "ok", "data": {}}',
])
def test_an_answer_naming_a_key_twice_is_malformed_never_its_last_value(raw: bytes) -> None:
    """Read with the last value, a record saying FAILED and then SUCCESSFUL was recovered
    as a success; ingest refuses such a webhook, and which one was meant is not ours."""
    with pytest.raises(MalformedEnvelope, match="names a key twice"):
        parse_envelope(raw)
    assert parse_envelope(raw.replace(b'"status": "FAILED", ', b"").replace(
        b'"success": true, "success"', b'"success"')).code == 0
