"""SQL for reconciliation: which subjects are due, what is known locally, and the writes.

Every function takes the caller's connection, so a chunk of results (ledger events and
the ``reconcile_subjects`` bookkeeping) commits in one transaction: a pass interrupted
anywhere resumes with exactly the subjects whose results did not commit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from projections.general_folds import PAYMENT_RANK, PAYOUT_RANK, amount_source
from reconcile.cancelled_invoices import Earlier
from reconcile.checks import CHECK_KINDS, SUCCESSORS, Local, OpenDiscrepancy
from reconcile.recorded_twice import RecordedTwice

Connection = psycopg.AsyncConnection[Any]
# open findings whose subject is asked about again; a malformed delivery's payment is asked
# about too, so the provider's record stands in for the webhook that could not be read
FOUND_ELSEWHERE = ["conflicting_events", "malformed_delivery"]  # by the projector
RECHECK_KINDS = [k for k in CHECK_KINDS if k != "missing_webhook"] + FOUND_ELSEWHERE
RECHECK_PRIORITY = 4  # the ``recent`` part of DUE_SQL (passed in): the rolling re-check
# final outcomes that can still change (a success refunded): re-checked though unchanged
LATER_STATES = {subject: sorted(SUCCESSORS.get(subject, {})) for subject in ("collection",
                                                                            "payout")}

# Since when a payment or payout row has been in its state, as far as reconciliation counts
# (its window, its backoff's age): the provider's time (``updated_at``), but never later
# than when its last event reached us (``le``: the ledger event at the row's
# ``last_position``), and that when it has none. A ``timestamp`` ahead of the clock (the
# provider's clock fast, a zone misread) held a pending payout unasked until that time came,
# for ever with a year 2099, and its backoff counted its age as none. The chat window is
# bounded by arrival alike (``projections.chat_folds.window_start``).
STATE_SINCE = "least(r.updated_at, le.received_at)"

DUE_SQL = f"""
WITH candidates AS (
    SELECT e.kind AS subject, e.reference, 1 AS priority, NULL::timestamptz AS detected_at
    FROM hookledger_private.expectations e
    LEFT JOIN hookledger_private.payments p
           ON e.kind = 'collection' AND p.reference = e.reference
    LEFT JOIN hookledger_private.payouts o ON e.kind = 'payout' AND o.reference = e.reference
    WHERE e.kind IN ('collection', 'payout')  -- a pending SMS is never waited for
      -- (an initiated_at ahead of the clock that registered it, a client's clock or a
      -- typo'd year, is waited for from the registration: else its lost webhook was
      -- waited for until that time came, for ever with a year 2099)
      AND ((least(e.initiated_at, e.registered_at) <= %(overdue)s
            AND coalesce(p.outcome, o.outcome, 'none') NOT IN ('success', 'failure',
                                                               'refunded'))
           -- paid other than expected: the provider's record says what was paid, asked at
           -- once rather than left to the rolling re-check's allowance
           OR (coalesce(p.outcome, o.outcome) = 'success'
               AND coalesce(p.amount, o.amount) <> e.amount))
    UNION ALL
    -- not final: overdue a window after the provider's time, or after the row's last
    -- event arrived if that is earlier (see STATE_SINCE)
    SELECT 'payout', r.reference, 2, NULL FROM hookledger_private.payouts r
    LEFT JOIN hookledger_private.ledger_events le ON le.position = r.last_position
    WHERE r.outcome NOT IN ('success', 'failure', 'refunded')
      AND {STATE_SINCE} <= %(overdue)s
    UNION ALL
    SELECT 'collection', r.reference, 2, NULL FROM hookledger_private.payments r
    LEFT JOIN hookledger_private.ledger_events le ON le.position = r.last_position
    WHERE r.outcome NOT IN ('success', 'failure', 'refunded')
      AND {STATE_SINCE} <= %(overdue)s
    UNION ALL
    -- an open finding is asked about again; one found since the subject's last check (a
    -- malformed refund after a checked confirmation) is asked about at once
    SELECT subject, reference, 3,
           -- (findings of a check itself are dated by it, so they never count here)
           CASE WHEN kind = ANY(%(found_elsewhere)s) THEN detected_at END
    FROM hookledger_private.discrepancies
    WHERE status = 'open' AND kind = ANY(%(recheck_kinds)s)
      AND subject IN ('collection', 'payout') AND reference <> ''
    UNION ALL
    -- a check that settled nothing (not known yet, still pending, an error) is asked again
    -- after its backoff, whatever made the subject due the first time
    SELECT subject, reference, 3, NULL FROM hookledger_private.reconcile_subjects
    WHERE next_check_at IS NOT NULL
), due AS (
    SELECT DISTINCT ON (c.subject, c.reference) c.subject, c.reference, c.priority
    FROM candidates c
    LEFT JOIN hookledger_private.reconcile_subjects s
           ON s.subject = c.subject AND s.reference = c.reference
    LEFT JOIN hookledger_private.payments p
           ON c.subject = 'collection' AND p.reference = c.reference
    LEFT JOIN hookledger_private.payouts o ON c.subject = 'payout' AND o.reference = c.reference
    WHERE s.subject IS NULL OR s.next_check_at <= %(retry_by)s
       OR coalesce(p.last_position, o.last_position, 0) > s.checked_position
       OR c.detected_at > s.last_checked_at
    ORDER BY c.subject, c.reference, c.priority
), recent AS (
    -- re-checks only: a subject due anyway is not one, and uses up none of the allowance.
    -- A final payment is re-checked once its row changed since its last check; one with a
    -- legitimate later state (a success can still be refunded) also when a check agreed
    -- with it (nothing else pending) long enough ago: the later state's webhook may be lost
    SELECT subject, reference, %(recheck_priority)s::int AS priority FROM (
        SELECT x.subject, x.reference, x.conflicted, x.last_position, x.later_possible,
               s.next_check_at, s.last_checked_at,
               s.subject IS NOT NULL AND x.last_position <= s.checked_position AS unchanged
        FROM (
            SELECT 'collection' AS subject, p.reference, p.last_position, p.conflicted,
                   p.outcome = ANY(%(collection_later)s) AS later_possible
            FROM hookledger_private.payments p
            WHERE p.outcome IN ('success', 'failure', 'refunded')
            UNION ALL
            SELECT 'payout', o.reference, o.last_position, o.conflicted,
                   o.outcome = ANY(%(payout_later)s)
            FROM hookledger_private.payouts o
            WHERE o.outcome IN ('success', 'failure', 'refunded')
        ) x
        JOIN hookledger_private.ledger_events le ON le.position = x.last_position
        LEFT JOIN hookledger_private.reconcile_subjects s
               ON s.subject = x.subject AND s.reference = x.reference
        WHERE le.received_at >= %(recent_since)s
          AND NOT EXISTS (SELECT 1 FROM due d WHERE d.subject = x.subject
                                                AND d.reference = x.reference)
    ) r
    WHERE NOT unchanged
       OR (later_possible AND next_check_at IS NULL
           AND last_checked_at <= %(later_before)s::timestamptz)
    -- changed rows first (conflicted ones first among them), then the longest unasked
    ORDER BY unchanged, conflicted DESC, CASE WHEN unchanged THEN last_checked_at END,
             last_position
    LIMIT %(recheck_limit)s
)
SELECT subject, reference, min(priority) AS priority FROM (
    SELECT * FROM due UNION ALL SELECT * FROM recent) u
GROUP BY subject, reference
ORDER BY min(priority), subject, reference
LIMIT %(limit)s
"""


@dataclass(frozen=True, slots=True)
class Due:
    subject: str
    reference: str
    priority: int

    @property
    def recheck(self) -> bool:
        """Asked about only by the rolling re-check (counted against its allowance)."""
        return self.priority == RECHECK_PRIORITY


async def due_subjects(conn: Connection, *, now: datetime, window: timedelta,
                       recheck_age: timedelta, recheck_limit: int, limit: int,
                       later_recheck: timedelta = timedelta(0),
                       early: timedelta = timedelta(0),
                       pass_began: datetime | None = None) -> list[Due]:
    """What to ask about now, at most ``limit``, of which at most ``recheck_limit`` only
    for the rolling re-check. A final payment younger than ``recheck_age`` whose outcome
    has a later state (:data:`~reconcile.checks.SUCCESSORS`) is re-checked every
    ``later_recheck`` after a check agreed with it (``0``: never). A backoff ending within
    ``early`` of ``now`` counts as ended: it is a multiple of the pass interval counted from
    the moment the last pass picked its subjects, and the next pass, picking a few
    milliseconds sooner after its own start, missed it and left the subject a whole
    interval longer.

    A backoff is judged by ``pass_began`` (default ``now``), when the pass picking began:
    a check sets a subject's backoff from its own chunk's moment, and judged by each
    chunk's ``now``, a pass that ran longer than that backoff asked its first chunks'
    subjects again, ahead of those it had not asked yet."""
    later_before = now - later_recheck if later_recheck > timedelta(0) else None
    cur = await conn.execute(DUE_SQL, {
        "now": now, "retry_by": (pass_began or now) + early, "overdue": now - window,
        "recent_since": now - recheck_age,
        "recheck_limit": recheck_limit, "recheck_priority": RECHECK_PRIORITY, "limit": limit,
        "recheck_kinds": RECHECK_KINDS,
        "found_elsewhere": FOUND_ELSEWHERE, "later_before": later_before,
        "collection_later": LATER_STATES["collection"], "payout_later": LATER_STATES["payout"]})
    return [Due(str(s), str(r), int(p)) for s, r, p in await cur.fetchall()]


async def local_views(conn: Connection, subjects: Sequence[Due]
                      ) -> tuple[dict[tuple[str, str], Local], dict[tuple[str, str], int]]:
    """Each subject's local view, and its projection row's last position (0 when none)."""
    refs = {kind: [d.reference for d in subjects if d.subject == kind]
            for kind in ("collection", "payout")}
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    async with conn.cursor(row_factory=dict_row) as cur:
        for kind, table in (("collection", "payments"), ("payout", "payouts")):
            await cur.execute(sql.SQL(
                "SELECT r.reference, r.outcome, r.status, r.amount, r.recovered, "
                f"{STATE_SINCE} AS since, r.last_position FROM {{}} r "
                "LEFT JOIN hookledger_private.ledger_events le ON le.position = r.last_position "
                "WHERE r.reference = ANY(%s)").format(
                    sql.Identifier("hookledger_private", table)), (refs[kind],))
            for loaded in await cur.fetchall():
                rows[(kind, loaded["reference"])] = loaded
        await cur.execute(
            "SELECT reference, kind, amount, least(initiated_at, registered_at) AS due_from "
            "FROM hookledger_private.expectations WHERE reference = ANY(%s)",
            ([d.reference for d in subjects],))
        expected = {(r["kind"], r["reference"]): r for r in await cur.fetchall()}
        # the open findings, the other kinds of record a resolved one already reported,
        # and the findings a person resolved
        await cur.execute(
            "SELECT id, kind, subject, reference, status, detail, resolved_by, facts "
            "FROM hookledger_private.discrepancies WHERE reference = ANY(%s) "
            "AND (status = 'open' OR resolved_by = 'admin' OR (status = 'resolved' "
            "AND kind = 'status_mismatch' AND facts ? 'provider_kinds'))",
            ([d.reference for d in subjects],))
        opened: dict[tuple[str, str], list[OpenDiscrepancy]] = {}
        looked_at: dict[tuple[str, str], set[str]] = {}
        dismissed: dict[tuple[str, str], set[tuple[str, str]]] = {}
        for found in await cur.fetchall():
            where = (found["subject"], found["reference"])
            if found["status"] == "open":
                opened.setdefault(where, []).append(
                    OpenDiscrepancy(found["id"], found["kind"], found["facts"] or {},
                                    found["detail"]))
                continue
            if found["resolved_by"] == "admin":
                dismissed.setdefault(where, set()).add((found["kind"], found["detail"]))
            if "provider_kinds" in (found["facts"] or {}) and found["kind"] == "status_mismatch":
                looked_at.setdefault(where, set()).add(found["facts"]["provider_kinds"])
    views: dict[tuple[str, str], Local] = {}
    positions: dict[tuple[str, str], int] = {}
    for d in subjects:
        key = (d.subject, d.reference)
        row = rows.get(key)
        exp: dict[str, Any] | None = expected.get(key)
        since = exp["due_from"] if exp is not None and (
            row is None or row["outcome"] == "pending") else (row or {}).get("since")
        views[key] = Local(
            subject=d.subject, reference=d.reference,
            outcome=row["outcome"] if row else None, status=row["status"] if row else None,
            amount=Decimal(row["amount"]) if row and row["amount"] is not None else None,
            recovered=bool(row["recovered"]) if row else False, since=since,
            expected_amount=Decimal(exp["amount"]) if exp else None,
            open=tuple(opened.get(key, ())),
            looked_at_kinds=frozenset(looked_at.get(key, ())),
            dismissed=frozenset(dismissed.get(key, ())))
        positions[key] = int(row["last_position"]) if row else 0
    return views, positions


async def known_references(conn: Connection, wanted: Sequence[tuple[str, str]]
                           ) -> set[tuple[str, str]]:
    """Which of these (subject, reference) already have a payments or payouts row."""
    known: set[tuple[str, str]] = set()
    for subject, table in (("collection", "payments"), ("payout", "payouts")):
        refs = [r for s, r in wanted if s == subject]
        if not refs:
            continue
        cur = await conn.execute(sql.SQL("SELECT reference FROM {} WHERE reference = ANY(%s)"
                                         ).format(sql.Identifier("hookledger_private", table)),
                                 (refs,))
        known.update((subject, str(r)) for r, in await cur.fetchall())
    return known


# the webhooks a payments or payouts row folds (a malformed copy on the stream is not one)
FOLDED_WEBHOOKS = sorted({*PAYMENT_RANK, *PAYOUT_RANK})


async def arrived_meanwhile(conn: Connection, spans: Sequence[tuple[str, str, int, int]]
                            ) -> set[tuple[str, str]]:
    """Which (subject, reference, seen, recovered) had a webhook its row folds appended
    after the position its check saw and before its recovery: one that came during the
    lookup (or one the projector had not folded yet), which the check never saw."""
    if not spans:
        return set()
    cur = await conn.execute(
        "SELECT s.subject, s.reference FROM unnest(%s::text[], %s::text[], %s::bigint[], "
        "%s::bigint[]) AS s(subject, reference, seen, recovered) WHERE EXISTS (SELECT 1 FROM "
        "hookledger_private.ledger_events e WHERE e.stream = s.subject || ':' || s.reference "
        "AND e.position > s.seen AND e.position < s.recovered AND e.source <> 'reconciler' "
        "AND e.event_type = ANY(%s))",
        ([x[0] for x in spans], [x[1] for x in spans], [x[2] for x in spans],
         [x[3] for x in spans], FOLDED_WEBHOOKS))
    return {(str(subject), str(reference)) for subject, reference in await cur.fetchall()}


async def mark_checked(conn: Connection, marks: Sequence[tuple[str, str, datetime, int,
                                                               datetime | None, str, str]]
                       ) -> None:
    """Upsert (subject, reference, checked_at, position, next_check_at, result, pass)."""
    async with conn.cursor() as cur:
        await cur.executemany(
            "INSERT INTO hookledger_private.reconcile_subjects AS s (subject, reference, "
            "last_checked_at, checked_position, next_check_at, last_result, checks, last_pass) "
            "VALUES (%s, %s, %s, %s, %s, %s, 1, %s) "
            "ON CONFLICT (subject, reference) DO UPDATE SET "
            "last_checked_at = EXCLUDED.last_checked_at, "
            "checked_position = EXCLUDED.checked_position, "
            "next_check_at = EXCLUDED.next_check_at, last_result = EXCLUDED.last_result, "
            "checks = s.checks + 1, last_pass = EXCLUDED.last_pass", list(marks))


async def previous_checks(conn: Connection, subjects: Sequence[Due]) -> dict[tuple[str, str],
                                                                             int]:
    cur = await conn.execute(
        "SELECT subject, reference, checks FROM hookledger_private.reconcile_subjects "
        "WHERE reference = ANY(%s)", ([d.reference for d in subjects],))
    return {(s, r): int(n) for s, r, n in await cur.fetchall()}


SETTLE_SQL = """
SELECT d.id, d.kind, d.subject, d.reference, d.facts,
       coalesce(p.outcome, o.outcome) AS outcome, coalesce(p.amount, o.amount) AS amount,
       coalesce(p.recovered, o.recovered, false) AS recovered, i.settled,
       i.amount_paid,
       (p.reference IS NOT NULL OR o.reference IS NOT NULL OR i.invoice_no IS NOT NULL) AS known
FROM hookledger_private.discrepancies d
LEFT JOIN hookledger_private.payments p
       ON d.subject = 'collection' AND p.reference = d.reference
LEFT JOIN hookledger_private.payouts o ON d.subject = 'payout' AND o.reference = d.reference
LEFT JOIN hookledger_private.invoices i ON d.subject = 'invoice' AND i.invoice_no = d.reference
WHERE d.status = 'open'
  AND d.kind IN ('unresolved', 'missing_webhook', 'status_mismatch', 'amount_mismatch',
                 'unsettled_paid_invoice', 'cancelled_invoice_paid')
"""


async def open_for_settling(conn: Connection) -> list[dict[str, Any]]:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(SETTLE_SQL)
        return list(await cur.fetchall())


@dataclass(frozen=True, slots=True)
class CancelledWithMoney:
    """A cancelled invoice whose row shows money received, and its findings so far."""

    number: str
    received: Decimal
    cause_position: int  # the event the amount came from, else the row's latest
    paid_in_at: int | None  # that event's position, when it was a payment bringing money in
    earlier: tuple[Earlier, ...]


CANCELLED_WITH_MONEY_SQL = """
SELECT i.invoice_no, i.amount_paid, i.last_position, i.provenance -> 'amount_paid',
       coalesce(jsonb_agg(jsonb_build_object(
           'id', d.id, 'amount', d.amount_at_risk::text, 'open', d.status = 'open',
           'resolved_by', d.resolved_by, 'position', d.last_position) ORDER BY d.id)
           FILTER (WHERE d.id IS NOT NULL),
           '[]')
FROM hookledger_private.invoices i
LEFT JOIN hookledger_private.discrepancies d
       ON d.subject = 'invoice' AND d.reference = i.invoice_no
      AND d.kind = 'cancelled_invoice_paid'
WHERE i.cancelled AND i.amount_paid > 0
GROUP BY i.invoice_no
ORDER BY i.invoice_no
"""


async def cancelled_with_money(conn: Connection) -> list[CancelledWithMoney]:
    """Every cancelled invoice whose row shows money received (a seek of the whole table:
    invoices a person resolved stay here, each pass, while the row says so)."""
    cur = await conn.execute(CANCELLED_WITH_MONEY_SQL)
    found = []
    for number, received, last, mark, earlier in await cur.fetchall():
        source = amount_source(mark)  # no mark of a known shape: the row's latest event
        found.append(CancelledWithMoney(
            str(number), Decimal(received), source[0] if source else int(last),
            source[0] if source and source[1] else None,
            tuple(Earlier(str(e["id"]), None if e["amount"] is None else Decimal(e["amount"]),
                          bool(e["open"]), e["resolved_by"], int(e["position"]))
                  for e in earlier)))
    return found


RECORDED_TWICE_SQL = """
WITH pairs AS (
    SELECT DISTINCT r.facts ->> 'subject' AS subject, r.facts ->> 'reference' AS ours,
           r.facts ->> 'provider_reference' AS theirs
    FROM hookledger_private.ledger_events r
    WHERE r.event_type = 'reconcile.recovered'
      AND r.facts ->> 'provider_reference' <> r.facts ->> 'reference'
)
SELECT pairs.subject, pairs.ours, pairs.theirs, coalesce(p.amount, o.amount),
       coalesce(p.last_position, o.last_position), coalesce(p.outcome, o.outcome),
       coalesce(p.recovered, o.recovered),
       EXISTS (SELECT 1 FROM hookledger_private.expectations e
               WHERE e.kind = pairs.subject AND e.reference = pairs.theirs),
       coalesce((SELECT jsonb_agg(jsonb_build_array(d.id, d.facts) ORDER BY d.id)
                 FROM hookledger_private.discrepancies d
                 WHERE d.status = 'open' AND d.kind = 'missing_webhook'
                   AND d.subject = pairs.subject AND d.reference = pairs.ours), '[]')
FROM pairs
LEFT JOIN hookledger_private.payments p
       ON pairs.subject = 'collection' AND p.reference = pairs.theirs
LEFT JOIN hookledger_private.payouts o ON pairs.subject = 'payout' AND o.reference = pairs.theirs
LEFT JOIN hookledger_private.payments mp
       ON pairs.subject = 'collection' AND mp.reference = pairs.ours
LEFT JOIN hookledger_private.payouts mo ON pairs.subject = 'payout' AND mo.reference = pairs.ours
WHERE coalesce(p.reference, o.reference) IS NOT NULL
  -- still the provider's record alone: a webhook of its own would make it a row like any
  AND coalesce(mp.recovered, mo.recovered)
  -- and webhooks brought the provider's spelling: not a recovery of its own, nor a copy
  -- kept unreadable
  AND EXISTS (SELECT 1 FROM hookledger_private.ledger_events e
              WHERE e.stream = pairs.subject || ':' || pairs.theirs
                AND e.source <> 'reconciler' AND e.event_type = ANY(%s))
ORDER BY 1, 2, 3
"""


async def recorded_twice(conn: Connection) -> list[RecordedTwice]:
    """Every recovered row filed under another spelling than the provider's, whose provider
    spelling has a row of its own (webhooks brought it). Recoveries are few (one per lost
    webhook), read by the ledger's event type index."""
    cur = await conn.execute(RECORDED_TWICE_SQL, (FOLDED_WEBHOOKS,))
    return [RecordedTwice(str(subject), str(ours), str(theirs),
                          None if amount is None else Decimal(amount), int(position),
                          None if outcome is None else str(outcome), bool(recovered),
                          bool(both_expected),
                          tuple((str(i), facts or {}) for i, facts in missing))
            for subject, ours, theirs, amount, position, outcome, recovered, both_expected,
            missing in await cur.fetchall()]


async def open_by_kind(conn: Connection) -> dict[str, int]:
    cur = await conn.execute("SELECT kind, count(*) FROM hookledger_private.discrepancies "
                             "WHERE status = 'open' GROUP BY kind")
    return {str(k): int(n) for k, n in await cur.fetchall()}


async def oldest_unchecked_expectation(conn: Connection) -> datetime | None:
    cur = await conn.execute(
        "SELECT min(least(e.initiated_at, e.registered_at)) "
        "FROM hookledger_private.expectations e "
        "LEFT JOIN hookledger_private.reconcile_subjects s "
        "ON s.subject = e.kind AND s.reference = e.reference "
        "LEFT JOIN hookledger_private.payments p ON e.kind = 'collection' "
        "AND p.reference = e.reference "
        "LEFT JOIN hookledger_private.payouts o ON e.kind = 'payout' AND o.reference = e.reference "
        "WHERE s.subject IS NULL AND e.kind IN ('collection', 'payout') "
        "AND coalesce(p.outcome, o.outcome, 'none') NOT IN ('success', 'failure', 'refunded')")
    row = await cur.fetchone()
    return row[0] if row else None


async def arrival_lags(conn: Connection, after: int, limit: int = 10000
                       ) -> tuple[int, list[float]]:
    """Seconds from the provider's timestamp to receipt, for general events after ``after``."""
    cur = await conn.execute(
        "SELECT position, extract(epoch FROM received_at - occurred_at)::float8 "
        "FROM hookledger_private.ledger_events WHERE position > %s AND source = 'general' "
        "AND occurred_at IS NOT NULL ORDER BY position LIMIT %s", (after, limit))
    rows = await cur.fetchall()
    if not rows:
        return after, []
    return int(rows[-1][0]), [float(lag) for _, lag in rows]
