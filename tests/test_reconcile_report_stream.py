"""Reports written from the database a row at a time: the same text as the in-memory
report, in memory that does not grow with the number of discrepancies."""

from __future__ import annotations

import asyncio
import json
import tracemalloc
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconcile.report import Row, at_risk, build_report, is_open
from reconcile.report_files import write_scheduled_report
from reconcile.report_render import FORMATS, render

SEED_SQL = """
INSERT INTO hookledger_private.discrepancies
  (id, kind, subject, service, reference, detail, amount_at_risk, status, detected_at,
   resolved_at, facts, event_count, last_position)
SELECT 'd' || g,
       (ARRAY['missing_webhook', 'status_mismatch', 'amount_mismatch'])[1 + g %% 3],
       'collection', 'Collection', 'REF-' || (g / 2),
       'the provider says SUCCESSFUL where webhooks said PENDING', (g %% 997) + 0.5,
       CASE WHEN g %% 2 = 0 THEN 'open' ELSE 'resolved' END,
       now() - make_interval(secs => g * 7),
       CASE WHEN g %% 2 = 0 THEN NULL ELSE now() - make_interval(secs => g) END,
       '{}'::jsonb, 1, g
FROM generate_series(%(first)s::int, %(last)s::int) g
"""


def seed(db_url: str, first: int, last: int) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(SEED_SQL, {"first": first, "last": last})


def read(path: Path) -> str:
    """The text as written, line endings untouched (CSV rows end in CRLF)."""
    with path.open(encoding="utf-8", newline="") as text:
        return text.read()


def peak_bytes_writing(db_url: str, directory: Path) -> int:
    tracemalloc.start()
    try:
        asyncio.run(write_scheduled_report(db_url, directory))
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_scheduled_report_holds_no_more_for_eight_times_the_discrepancies(
        db_url: str, tmp_path: Path) -> None:
    """Every discrepancy ever found, resolved ones included, was loaded into the service
    and every format built as one string: 200,000 of them took 600 MB in the worker
    answering webhooks, and a table that only grows took more every month."""
    seed(db_url, 1, 3_000)
    small = peak_bytes_writing(db_url, tmp_path / "small")
    seed(db_url, 3_001, 24_000)
    large = peak_bytes_writing(db_url, tmp_path / "large")
    assert read(tmp_path / "large" / "latest.csv").count("\r\n") == 12_001
    assert large < small * 1.5 + 2**20, (small, large)


moments = st.datetimes(min_value=datetime(2026, 1, 1), max_value=datetime(2026, 12, 31),
                       timezones=st.just(UTC))
texts = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"),
                max_size=12)


@st.composite
def discrepancy_rows(draw: st.DrawFn) -> list[Row]:
    count = draw(st.integers(0, 12))
    refs = draw(st.lists(texts, min_size=1, max_size=4))
    out = []
    for i in range(count):
        status = draw(st.sampled_from(["open", "resolved"]))
        detected = draw(st.none() | moments) if status == "resolved" else draw(moments)
        out.append(Row(
            id=f"id-{i:03}", kind=draw(st.sampled_from(["missing_webhook", "unresolved",
                                                        "amount_mismatch"])),
            service=draw(st.sampled_from(["Collection", "Disbursement"])),
            subject=draw(st.sampled_from(["collection", "payout"])),
            reference=draw(st.sampled_from(refs)), detail=draw(texts),
            amount_at_risk=draw(st.none() | st.decimals(0, 10**9, places=2)),
            status=status, detected_at=detected,
            resolved_at=None if status == "open" else draw(moments),
            code=draw(st.none() | st.sampled_from([91000, 91052, 92050]))))
    return out


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=discrepancy_rows())
def test_the_files_written_from_the_database_are_the_report_built_in_memory(
        db_url: str, tmp_path_factory: object, items: list[Row]) -> None:
    """Any rows, however their payments, times and texts fall: totals, money at risk
    counted once per payment, and the open list in every format, byte for byte."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("TRUNCATE hookledger_private.discrepancies")
        for i, r in enumerate(items):
            conn.execute(
                "INSERT INTO hookledger_private.discrepancies (id, kind, subject, service, "
                "reference, detail, amount_at_risk, status, detected_at, resolved_at, "
                "facts, event_count, last_position) VALUES (%s, %s, %s, %s, %s, %s, %s, "
                "%s, %s, %s, jsonb_build_object('provider_code', %s::int), 1, %s)",
                (r.id, r.kind, r.subject, r.service, r.reference, r.detail,
                 r.amount_at_risk, r.status, r.detected_at, r.resolved_at, r.code, i))
    directory = Path(str(tmp_path_factory.mktemp("reports")))  # type: ignore[attr-defined]
    asyncio.run(write_scheduled_report(db_url, directory))
    # ages are counted from the report's own moment, which the JSON states
    generated = datetime.fromisoformat(
        json.loads((directory / "latest.json").read_text(encoding="utf-8"))["generated_at"])
    expected = build_report(items, now=generated)
    # the report sums as its definition says: each payment once, at its largest amount
    open_rows = [r for r in items if is_open(r)]
    assert Decimal(expected["totals"]["amount_at_risk_open"]) == at_risk(open_rows)
    for entry in expected["by_kind"]:
        assert Decimal(entry["amount_at_risk_open"]) == at_risk(
            r for r in open_rows if r.kind == entry["kind"])
    assert render(expected, "json") == json.dumps(expected, indent=2, ensure_ascii=False) + "\n"
    for fmt in FORMATS:
        assert read(directory / f"latest.{fmt}") == render(expected, fmt), fmt


def test_workers_sharing_a_home_write_each_scheduled_report_once(
        db_url: str, tmp_path: Path) -> None:
    """Every worker of a ``serve`` ran the report schedule: each interval every one of them
    read the whole table and wrote the whole report again, beside the others."""
    from reconcile.scheduler import ReconcileScheduler

    seed(db_url, 1, 2_000)

    def worker() -> ReconcileScheduler:
        return ReconcileScheduler(None, None, interval_s=60, database_url=db_url,
                                  reports_dir=tmp_path, report_interval_s=3600)

    async def two_workers_at_once() -> list[object]:
        return list(await asyncio.gather(worker().report_once(), worker().report_once()))

    results = asyncio.run(two_workers_at_once())
    assert sorted(bool(r) for r in results) == [False, True]
    # and one whose clock fires a moment later finds this interval's report written
    assert not asyncio.run(worker().report_once())
    assert len(list(tmp_path.glob("discrepancies-*"))) == len(FORMATS)


def test_a_report_that_took_long_does_not_make_the_next_interval_skip(
        db_url: str, tmp_path: Path) -> None:
    """Measured from when the last report finished, a report taking more than half the
    interval made a lone worker skip every other interval: it counts from when it began."""
    from datetime import timedelta

    from reconcile.report_files import STAMP_FORMAT
    from reconcile.scheduler import ReconcileScheduler

    began = datetime.now(UTC) - timedelta(seconds=40)  # finished just now, 40 s later
    for fmt in FORMATS:
        (tmp_path / f"discrepancies-{began.strftime(STAMP_FORMAT)}.{fmt}").write_text("")
        (tmp_path / f"latest.{fmt}").write_text("")
    worker = ReconcileScheduler(None, None, interval_s=60, database_url=db_url,
                                reports_dir=tmp_path, report_interval_s=60)
    assert asyncio.run(worker.report_once())


def test_a_report_stamped_ahead_of_the_clock_does_not_stop_the_schedule(
        db_url: str, tmp_path: Path) -> None:
    """A clock that ran ahead (a host booted a day fast, then set right by NTP) left a
    report stamped in the future: every interval counted it as begun less than half an
    interval ago and skipped, so no report was written until the clock reached that
    stamp, a day later; a stamp ahead of the clock is no report of this interval."""
    from datetime import timedelta

    from reconcile.report_files import STAMP_FORMAT
    from reconcile.scheduler import ReconcileScheduler

    ahead = datetime.now(UTC) + timedelta(days=1)
    for fmt in FORMATS:
        (tmp_path / f"discrepancies-{ahead.strftime(STAMP_FORMAT)}.{fmt}").write_text("")

    def worker() -> ReconcileScheduler:
        return ReconcileScheduler(None, None, interval_s=60, database_url=db_url,
                                  reports_dir=tmp_path, report_interval_s=3600)

    assert asyncio.run(worker().report_once())
    # and the report just written, not the one ahead, is the one this interval has
    assert not asyncio.run(worker().report_once())
    assert len(list(tmp_path.glob("discrepancies-*"))) == 2 * len(FORMATS)


def test_a_finding_kept_with_a_code_past_32_bits_leaves_every_report_written(
        db_url: str, tmp_path: Path) -> None:
    """A release before such codes were refused at the source kept the provider's code as
    given in a finding's facts. The report read it with a cast to ``int``, which failed
    every report, scheduled or asked for, from then on; such a code is no 9SOO code, and
    the finding is listed without its retry advice."""
    from tests.projection_events import new_event
    from tests.test_projector import _provider_verdict_events, append_all, project_all

    events = [new_event("payment.confirmed", 91000, reference="HUGE", amount=100),
              *_provider_verdict_events("HUGE", 9_100_000_055),
              new_event("payment.confirmed", 91000, reference="FAILS", amount=100),
              *_provider_verdict_events("FAILS", 91055)]
    asyncio.run(append_all(db_url, events))
    asyncio.run(project_all(db_url))
    asyncio.run(write_scheduled_report(db_url, tmp_path))
    listed = {item["reference"]: item["action"] for item in
              json.loads((tmp_path / "latest.json").read_text(encoding="utf-8"))["open"]}
    assert set(listed) == {"HUGE", "FAILS"}
    assert "Code 91055" in listed["FAILS"] and "Code" not in listed["HUGE"]
