"""The commands: hookledger expect, reconcile (one pass, printed) and report."""

from __future__ import annotations

import json
import os
import resource
import signal
import stat
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from hookledger.cli import main
from sandbox.runner import running_sandbox
from tests.dbutil import database_read_only
from tests.reconcile_helpers import API_KEY, CountingState, body


def report_command(db_url: str, tmp_path: Path, fmt: str, *, buffered: bool = False,
                   stderr: int = subprocess.PIPE) -> subprocess.Popen[bytes]:
    """``hookledger report --format fmt`` in a process of its own, its output a pipe;
    ``buffered``: standard output buffered as it is without ``PYTHONUNBUFFERED``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOOKLEDGER_")
           and not (buffered and k == "PYTHONUNBUFFERED")}
    env.update(HOOKLEDGER_DATABASE_URL=db_url, HOOKLEDGER_HOME=str(tmp_path / "home"))
    return subprocess.Popen([sys.executable, "-m", "hookledger", "report", "--format", fmt],
                            env=env, stdout=subprocess.PIPE, stderr=stderr)


def test_expect_reconcile_and_report_from_the_command_line(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = CountingState()
    state.record_general(body("payment.confirmed", 91000, reference="CLI-1", amount=321))
    runner = CliRunner()
    with running_sandbox(state=state) as api:
        monkeypatch.setenv("HOOKLEDGER_DATABASE_URL", db_url)
        monkeypatch.setenv("HOOKLEDGER_API_BASE_URL", api.url)
        monkeypatch.setenv("HOOKLEDGER_API_KEY", API_KEY)
        monkeypatch.setenv("HOOKLEDGER_HOME", str(tmp_path))
        registered = runner.invoke(main, ["expect", "CLI-1", "--kind", "collection",
                                          "--amount", "321", "--initiated-at",
                                          "2026-01-01T00:00:00+00:00"])
        assert registered.exit_code == 0, registered.output
        assert "registered: collection CLI-1 321 TZS" in registered.output
        bad = runner.invoke(main, ["expect", "CLI-2", "--kind", "collection",
                                   "--amount", "-3"])
        assert bad.exit_code != 0
        unset = runner.invoke(main, ["expect", "CLI-2", "--kind", "collection", "--amount",
                                     "5", "--initiated-at", ""])  # a script's unset variable
        assert unset.exit_code == 2 and "initiated_at" in unset.output  # was "now", silently
        no_amount = runner.invoke(main, ["expect", "CLI-2", "--kind", "payout"])
        assert no_amount.exit_code != 0 and "amount is required" in no_amount.output
        for amount, said in (("1e3", "registered: collection CLI-3 1000 TZS"),
                             ("1000.00", "already registered: collection CLI-3 1000 TZS")):
            plain = runner.invoke(main, ["expect", "CLI-3", "--kind", "collection",
                                         "--amount", amount])  # once printed 1E+3, 1000.00
            assert plain.exit_code == 0 and said in plain.output, plain.output
        sms = runner.invoke(main, ["expect", "SMS-1", "--kind", "sms"])
        assert sms.exit_code == 0, sms.output
        assert "registered: sms SMS-1 0 TZS" in sms.output
        found = runner.invoke(main, ["reconcile"])
        assert found.exit_code == 0, found.output
        assert "missing_webhook" in found.output and "CLI-1" in found.output
        assert API_KEY not in found.output
        out = tmp_path / "r.json"
        report = runner.invoke(main, ["report", "--format", "json", "--out", str(out)])
        assert report.exit_code == 0, report.output
        since = runner.invoke(main, ["report", "--format", "json", "--out", str(out) + "s",
                                     "--since", "2026-01-01T03:00:00+03:00"])
        assert since.exit_code == 0, since.output
    data = json.loads(out.read_text())
    assert data["totals"]["open"] == 1
    assert data["open"][0]["reference"] == "CLI-1"
    # every time in a report is UTC, the one given to --since too
    assert json.loads((tmp_path / "r.jsons").read_text())["since"] == (
        "2026-01-01T00:00:00+00:00")


def test_a_pass_whose_every_lookup_failed_exits_4_not_0(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every lookup an error (a wrong key or URL looks like this): exit 0 read as "all
    clear" to a script. A pass with nothing to ask is no failure."""
    from sandbox.faults import FaultSettings

    state = CountingState()
    state.record_general(body("payment.confirmed", 91000, reference="ERR-1", amount=5))
    monkeypatch.setenv("HOOKLEDGER_DATABASE_URL", db_url)
    monkeypatch.setenv("HOOKLEDGER_API_KEY", API_KEY)
    monkeypatch.setenv("HOOKLEDGER_HOME", str(tmp_path))
    runner = CliRunner()
    assert runner.invoke(main, ["expect", "ERR-1", "--kind", "collection", "--amount", "5",
                                "--initiated-at", "2026-01-01T00:00:00+00:00"]).exit_code == 0
    with running_sandbox(state=state, faults=FaultSettings(error_rate=1.0)) as api:
        monkeypatch.setenv("HOOKLEDGER_API_BASE_URL", api.url)
        failed = runner.invoke(main, ["reconcile"])
    assert failed.exit_code == 4, failed.output
    assert "every lookup failed" in failed.output and "API errors" in failed.output
    # the subject waits out its backoff now: a pass that asks nothing is no failure
    idle = runner.invoke(main, ["reconcile"])
    assert idle.exit_code == 0 and "checked 0 subject(s)" in idle.output, idle.output


@pytest.mark.parametrize("since", ["yesterday", "0001-01-01T00:00:00+01:00",
                                   "9999-12-31T23:00:00-05:00"])
def test_a_since_no_report_can_start_from_names_the_option(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, since: str) -> None:
    """An instant past the clock's range in UTC stopped the command with an OverflowError
    traceback; a word that is no date was refused without naming --since."""
    monkeypatch.setenv("HOOKLEDGER_DATABASE_URL", db_url)
    monkeypatch.setenv("HOOKLEDGER_HOME", str(tmp_path))
    result = CliRunner().invoke(main, ["report", "--format", "json", "--since", since])
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    assert "Invalid value for --since: an ISO 8601 date or date-time" in result.output


RECONCILE_DURATIONS = ("HOOKLEDGER_RESOLUTION_WINDOW_S", "HOOKLEDGER_RECONCILE_INTERVAL_S",
                       "HOOKLEDGER_RECONCILE_PAYOUT_WINDOW_S",
                       "HOOKLEDGER_RECONCILE_RECHECK_AGE_S",
                       "HOOKLEDGER_RECONCILE_REFUND_RECHECK_S")


@pytest.mark.parametrize("variable", RECONCILE_DURATIONS)
def test_a_window_past_what_the_clock_holds_stops_reconcile_naming_it(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str) -> None:
    """A "never" such as 99999999999 s was taken, then every pass failed with an
    OverflowError traceback naming no variable (``serve``'s passes too, each interval)."""
    monkeypatch.setenv("HOOKLEDGER_DATABASE_URL", db_url)
    monkeypatch.setenv("HOOKLEDGER_HOME", str(tmp_path))
    monkeypatch.setenv("HOOKLEDGER_API_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv(variable, "99999999999")
    result = CliRunner().invoke(main, ["reconcile"])
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    assert f"{variable}: Input should be less than or equal to" in result.output


def test_a_pass_runs_at_the_longest_windows_the_settings_allow(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound is one the pass can compute with: ten years back and ahead."""
    from hookledger.settings import MAX_DURATION_S

    state = CountingState()
    state.record_general(body("payment.confirmed", 91000, reference="LONG-1", amount=5))
    monkeypatch.setenv("HOOKLEDGER_DATABASE_URL", db_url)
    monkeypatch.setenv("HOOKLEDGER_HOME", str(tmp_path))
    monkeypatch.setenv("HOOKLEDGER_API_KEY", API_KEY)
    for variable in RECONCILE_DURATIONS:
        monkeypatch.setenv(variable, str(MAX_DURATION_S))
    runner = CliRunner()
    assert runner.invoke(main, ["expect", "LONG-1", "--kind", "collection", "--amount", "5",
                                "--initiated-at", "2026-01-01T00:00:00+00:00"]).exit_code == 0
    with running_sandbox(state=state) as api:
        monkeypatch.setenv("HOOKLEDGER_API_BASE_URL", api.url)
        result = runner.invoke(main, ["reconcile"])
    assert result.exit_code == 0, result.output
    assert result.exception is None


def test_db_url_prints_what_psql_takes_even_when_configured_for_sqlalchemy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOOKLEDGER_HOME", str(tmp_path))
    for given in ("postgresql+psycopg://u@db.example:5432/ledger",
                  "postgresql://u@db.example:5432/ledger"):
        monkeypatch.setenv("HOOKLEDGER_DATABASE_URL", given)
        printed = CliRunner().invoke(main, ["db", "url"])
        assert printed.exit_code == 0, printed.output
        assert printed.output.strip() == "postgresql://u@db.example:5432/ledger"


def test_a_person_resolves_a_malformed_delivery_once(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.reconcile_helpers import deliver, rows

    deliver(db_url, "invoice.updated", 91000, reference="INV-M", amount="3000")
    [(found, status)] = rows(db_url, "SELECT id, status FROM hookledger.discrepancies "
                                     "WHERE kind = 'malformed_delivery'")
    assert status == "open"
    monkeypatch.setenv("HOOKLEDGER_DATABASE_URL", db_url)
    monkeypatch.setenv("HOOKLEDGER_HOME", str(tmp_path))
    runner = CliRunner()
    unknown = runner.invoke(main, ["resolve", "no-such-id", "--reason", "x"])
    assert unknown.exit_code == 2
    done = runner.invoke(main, ["resolve", found, "--reason", "checked INV-M by hand"])
    assert done.exit_code == 0, done.output
    assert done.output.strip() == f"resolved: {found}"
    again = runner.invoke(main, ["resolve", found, "--reason", "twice"])
    assert again.output.strip() == f"already resolved: {found}"
    assert rows(db_url, "SELECT status, resolution, resolved_by "
                        "FROM hookledger.discrepancies") == [
        ("resolved", "checked INV-M by hand", "admin")]
    assert rows(db_url, "SELECT source FROM hookledger.ledger "
                        "WHERE event_type = 'discrepancy.resolved'") == [("admin",)]


def test_a_reason_or_id_that_is_not_utf8_is_a_message_not_a_traceback(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Typed in a terminal whose encoding is not the locale's (Latin-1 under a UTF-8 or C
    locale), an argument's bytes reach Python as lone surrogates: the resolution's event
    could not be encoded, and an id not be sent, each a UnicodeEncodeError traceback and
    exit 1, where ``expect`` refuses such a reference in a line."""
    from tests.reconcile_helpers import deliver, rows

    deliver(db_url, "invoice.updated", 91000, reference="INV-U", amount="3000")
    [(found,)] = rows(db_url, "SELECT id FROM hookledger.discrepancies "
                              "WHERE kind = 'malformed_delivery'")
    monkeypatch.setenv("HOOKLEDGER_DATABASE_URL", db_url)
    monkeypatch.setenv("HOOKLEDGER_HOME", str(tmp_path))
    runner = CliRunner()
    latin1 = b"checked in Z\xfcrich".decode("utf-8", "surrogateescape")  # as argv gives it
    refused = runner.invoke(main, ["resolve", found, "--reason", latin1])
    assert refused.exit_code == 2 and isinstance(refused.exception, SystemExit), (
        refused.output)
    assert "--reason" in refused.output and "UTF-8" in refused.output
    unknown = runner.invoke(main, ["resolve", found + "\udcff", "--reason", "x"])
    assert unknown.exit_code == 2 and isinstance(unknown.exception, SystemExit), (
        unknown.output)
    assert "no discrepancy" in unknown.output
    assert rows(db_url, "SELECT status FROM hookledger.discrepancies") == [("open",)]


def test_a_report_that_cannot_be_written_is_a_message_not_a_traceback(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOOKLEDGER_DATABASE_URL", db_url)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = CliRunner().invoke(main, ["report", "--format", "csv",
                                       "--out", str(blocker / "r.csv")])
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    assert f"cannot write {blocker / 'r.csv'}" in result.output


def test_a_report_the_disk_cannot_hold_leaves_the_previous_one_whole(
        db_url: str, tmp_path: Path) -> None:
    """``--out`` wrote in place: a disk that filled up mid-write (here a file size limit,
    which fails a write the same way) left a truncated report under the name, and the
    previous report was gone."""
    out = tmp_path / "report.html"
    out.write_text("<p>the previous report</p>")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOOKLEDGER_")}
    env.update(HOOKLEDGER_DATABASE_URL=db_url, HOOKLEDGER_HOME=str(tmp_path / "home"))

    def small_disk() -> None:  # in the child: a write past 1 KiB fails (EFBIG), no signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE,
                           (1024, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    done = subprocess.run([sys.executable, "-m", "hookledger", "report", "--format", "html",
                           "--out", str(out)], env=env, capture_output=True, text=True,
                          preexec_fn=small_disk, timeout=120)
    assert done.returncode == 2, done.stderr
    assert f"cannot write {out}" in done.stderr
    assert out.read_text() == "<p>the previous report</p>"
    assert not list(tmp_path.glob(".*.tmp"))  # no temporary left behind


def test_a_report_written_out_keeps_a_private_files_mode_and_honours_the_umask(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Renamed into place, every ``--out`` file became 0644: a report someone kept private
    (references and amounts) turned world-readable, and a umask of 077 was ignored."""
    monkeypatch.setenv("HOOKLEDGER_DATABASE_URL", db_url)
    private = tmp_path / "private.csv"
    private.write_text("old")
    private.chmod(0o600)
    assert CliRunner().invoke(main, ["report", "--format", "csv", "--out", str(private)]
                              ).exit_code == 0
    assert stat.S_IMODE(private.stat().st_mode) == 0o600 and private.read_text() != "old"
    before = os.umask(0o077)
    try:
        fresh = tmp_path / "fresh.csv"
        assert CliRunner().invoke(main, ["report", "--format", "csv", "--out", str(fresh)]
                                  ).exit_code == 0
    finally:
        os.umask(before)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o600


def test_a_report_read_only_in_part_ends_quietly(db_url: str, tmp_path: Path) -> None:
    """Written to standard output as it is read: ``hookledger report | head`` stops the
    reader early, and the command ends without a traceback."""
    from tests.test_reconcile_report_stream import seed

    seed(db_url, 1, 4_000)  # far more than a pipe holds
    command = report_command(db_url, tmp_path, "csv")
    assert command.stdout is not None and command.stderr is not None
    header = command.stdout.readline()
    command.stdout.close()
    errors = command.stderr.read().decode()
    assert command.wait(timeout=120) == 1
    assert header.startswith(b"id,kind,service,subject,reference,amount_at_risk")
    assert "Traceback" not in errors and "Broken pipe" not in errors, errors


def test_a_report_whose_reader_is_gone_before_it_is_written_ends_quietly(
        db_url: str, tmp_path: Path) -> None:
    """A report small enough to sit in standard output's buffer was written only at the
    interpreter's exit, past click's handling of a closed pipe: with the reader gone
    (``| true``), Python printed an ignored BrokenPipeError and exited 120."""
    command = report_command(db_url, tmp_path, "md", buffered=True)
    assert command.stdout is not None and command.stderr is not None
    command.stdout.close()  # long before the command has written anything
    errors = command.stderr.read().decode()
    assert command.wait(timeout=120) == 1, errors
    assert "Traceback" not in errors and "BrokenPipe" not in errors, errors


def test_a_report_to_a_reader_that_pauses_holds_no_snapshot_meanwhile(
        db_url: str, tmp_path: Path) -> None:
    """Written to standard output while its snapshot was open, a report read by a pager
    that paused for a minute was cut off by the server (idle in transaction), half written,
    with a traceback; and meanwhile it held back vacuum. It is whole before it is copied."""
    import array
    import fcntl
    import termios
    import time

    from tests.reconcile_helpers import rows
    from tests.test_reconcile_report_stream import seed

    def queued(fd: int) -> int:
        size = array.array("i", [0])
        fcntl.ioctl(fd, termios.FIONREAD, size)
        return size[0]

    seed(db_url, 1, 4_000)  # far more than a pipe holds
    command = report_command(db_url, tmp_path, "csv", stderr=subprocess.DEVNULL)
    assert command.stdout is not None
    try:
        deadline = time.monotonic() + 60
        capacity = fcntl.fcntl(command.stdout.fileno(), fcntl.F_GETPIPE_SZ)
        before = -1
        while True:  # until the pipe is mostly full and nothing more comes: the writer waits
            now = queued(command.stdout.fileno())
            if now == before and now > capacity // 2:
                break
            assert command.poll() is None and time.monotonic() < deadline
            before = now
            time.sleep(0.2)
        # the reader pauses here, the writer waits on the full pipe: with what open?
        held = rows(db_url, "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                            "current_database() AND state LIKE 'idle in transaction%%'")
    finally:
        written = command.stdout.read()
        command.wait(timeout=60)
    assert held == [(0,)]
    assert command.returncode == 0 and written.count(b"\r\n") == 2_001


def test_a_resolution_someone_else_appended_first_is_not_reported_as_the_persons(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reconcile pass resolving the discrepancy between ``resolve``'s look at it and its
    append took the resolution's key first: the person's resolution (and reason) was not
    kept, yet the command said ``resolved``. Here the key is taken by an event no fold
    applies, so the view still shows the discrepancy open when the command looks."""
    import asyncio
    import dataclasses
    from datetime import UTC, datetime

    from reconcile.findings import resolved_event
    from tests.reconcile_helpers import append, deliver, rows

    deliver(db_url, "invoice.updated", 91000, reference="INV-R", amount="3000")
    [(found,)] = rows(db_url, "SELECT id FROM hookledger.discrepancies "
                              "WHERE kind = 'malformed_delivery'")
    taken = dataclasses.replace(
        resolved_event(found, "invoice", "INV-R", "found by a pass", "p-1", datetime.now(UTC)),
        event_type="test.key_taken")
    asyncio.run(append(db_url, [taken]))
    monkeypatch.setenv("HOOKLEDGER_DATABASE_URL", db_url)
    monkeypatch.setenv("HOOKLEDGER_HOME", str(tmp_path))
    done = CliRunner().invoke(main, ["resolve", found, "--reason", "checked by hand"])
    assert done.exit_code == 0, done.output
    assert done.output.strip() == f"already resolved: {found}"
    assert rows(db_url, "SELECT count(*) FROM hookledger.ledger WHERE source = 'admin'") == [
        (0,)]


def test_a_report_on_standard_output_is_utf8_whatever_its_encoding(
        db_url: str, tmp_path: Path) -> None:
    """References and details come from webhooks in any script: written as text to a
    standard output in another encoding (``PYTHONIOENCODING``, an ISO-8859-1 ``LANG``),
    ``M-€`` stopped the report with a UnicodeEncodeError, and the HTML page, which says it
    is UTF-8, was not."""
    from hookledger import migrate

    migrate.upgrade(db_url)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("""
            INSERT INTO hookledger_private.discrepancies
              (id, kind, subject, service, reference, detail, amount_at_risk, status,
               detected_at, resolved_at, facts, event_count, last_position)
            VALUES ('d1', 'missing_webhook', 'collection', 'Collection', 'M-€',
                    'mteja Zürich ✓', 5, 'open', now(), NULL, '{}', 1, 1)""")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOOKLEDGER_")}
    env.update(HOOKLEDGER_DATABASE_URL=db_url, HOOKLEDGER_HOME=str(tmp_path / "home"),
               PYTHONIOENCODING="latin-1")
    for fmt in ("html", "md", "csv", "json"):
        done = subprocess.run([sys.executable, "-m", "hookledger", "report", "--format", fmt],
                              env=env, capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr.decode(errors="replace")[-400:]
        text = done.stdout.decode("utf-8")
        assert "M-€" in text and "Zürich ✓" in text, fmt



def test_on_a_read_only_database_report_reads_and_a_write_is_a_message(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica, or sessions read-only by default: every command ran the migrations first,
    whose run begins with a write, so even ``report`` stopped with a page of traceback
    though nothing was due; a command that writes did too."""
    monkeypatch.setenv("HOOKLEDGER_DATABASE_URL", db_url)
    monkeypatch.setenv("HOOKLEDGER_HOME", str(tmp_path))
    runner = CliRunner()
    assert runner.invoke(main, ["expect", "RO-1", "--kind", "collection",
                                "--amount", "5"]).exit_code == 0
    with database_read_only(db_url):
        report = runner.invoke(main, ["report", "--format", "json"])
        assert report.exit_code == 0, report.output
        assert json.loads(report.stdout)["totals"]["open"] == 0
        refused = runner.invoke(main, ["expect", "RO-2", "--kind", "collection",
                                       "--amount", "5"])
        assert refused.exit_code == 2, refused.output
        assert "takes no writes" in refused.output and "Traceback" not in refused.output


def test_reconcile_prints_a_delivery_s_control_characters_escaped(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reference a signed delivery chose was printed as it came: on a terminal, escape
    sequences that erase what the pass printed before it, and a carriage return or line
    separator that adds a forged ``resolved`` line to what a person or a script reads."""
    from tests.reconcile_helpers import deliver

    reference = "FORGE-1\x1b[1A\x1b[2K\r  resolved missing_webhook collection FORGE-2\u2028"
    deliver(db_url, "payment.confirmed", 91000, reference=reference, amount=5)
    monkeypatch.setenv("HOOKLEDGER_DATABASE_URL", db_url)
    monkeypatch.setenv("HOOKLEDGER_HOME", str(tmp_path))
    monkeypatch.setenv("HOOKLEDGER_API_KEY", API_KEY)
    with running_sandbox(state=CountingState()) as api:
        monkeypatch.setenv("HOOKLEDGER_API_BASE_URL", api.url)
        result = CliRunner().invoke(main, ["reconcile"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    (detected,) = [line for line in lines if "FORGE-1" in line]
    assert "unknown_at_provider" in detected
    assert "FORGE-1\\x1b[1A\\x1b[2K\\r  resolved" in detected
    assert not [line for line in lines if line.lstrip().startswith("resolved")]
    assert not [c for c in result.output if not c.isprintable() and c != "\n"]
