"""``hookledger reconcile``, ``report``, ``expect`` and ``resolve``.

Part of the composition root (mounted by hookledger/cli.py): settings and the database
come from there, so these commands behave like the others (embedded PostgreSQL when no
database is configured; migrations applied first).
"""

from __future__ import annotations

import asyncio
import sys
from datetime import UTC, datetime
from pathlib import Path

import click
import psycopg

from hookledger import migrate
from hookledger.database import database
from hookledger.logs import escaped
from hookledger.settings import Settings
from ledger.jsonenc import jsonb_can_hold
from reconcile.errors import ReconcileError
from reconcile.report_files import atomic_text, spooled, stream_report
from reconcile.report_render import FORMATS

SKIPPED_EXIT = 3  # `reconcile` found another pass running and checked nothing
# every subject it asked about was an API error: it learned nothing (a wrong base URL or
# a provider that is down looks like this), and a script must not take it for "all clear"
ALL_FAILED_EXIT = 4
# the provider refused the API key (reconcile.client.KEY_REFUSED), and the pass stopped
# asking there: told apart from 4, since a key is put right where an outage is waited out
KEY_REFUSED_EXIT = 5


def _root() -> Settings:
    from hookledger.cli import configure_logging, load_settings

    settings = load_settings()
    configure_logging(settings)
    return settings


@click.command(name="reconcile")
def reconcile_command() -> None:
    """Run one reconciliation pass now and print what it found."""
    from reconcile.client import KEY_REFUSED
    from reconcile.runner import PassResult, Reconciler
    from reconcile.wiring import client_from, config_from

    settings = _root()
    if not settings.api_base_url:
        click.echo("hookledger: HOOKLEDGER_API_BASE_URL is not set; nothing to reconcile",
                   err=True)
        sys.exit(2)
    with database(settings) as url:
        migrate.upgrade(url)

        async def once() -> PassResult:
            async with client_from(settings) as client:
                return await Reconciler(url, client, config_from(settings)).run_pass()

        result = asyncio.run(once())
    for line in result.summary():
        # a reference or detail is a delivery's or the provider's text: its control
        # characters (a carriage return, an escape sequence) shown, never obeyed
        click.echo(escaped(line))
    if result.skipped:  # nothing was checked: a script must not take it for "all clear"
        sys.exit(SKIPPED_EXIT)
    if result.stopped == KEY_REFUSED:
        click.echo("hookledger: the provider refused the API key; the pass stopped asking, "
                   f"{result.left_due} subject(s) it had picked unanswered (they and every "
                   "other subject due wait for the next pass; check HOOKLEDGER_API_KEY)",
                   err=True)
        sys.exit(KEY_REFUSED_EXIT)
    if result.checked and result.results.get("error", 0) == result.checked:
        click.echo("hookledger: every lookup failed; nothing was learned (the errors are "
                   "above: refused or unreachable every time usually means "
                   "HOOKLEDGER_API_BASE_URL or HOOKLEDGER_API_KEY)", err=True)
        sys.exit(ALL_FAILED_EXIT)


def _since(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        # in UTC, as every other time in a report (``--since ...+03:00`` was shown as given)
        return parsed.astimezone(UTC) if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    except (ValueError, OverflowError) as exc:
        # OverflowError: an instant whose UTC is past year 1 or 9999 (0001-01-01T00:00+01:00)
        # stopped the command with a traceback
        raise click.BadParameter("an ISO 8601 date or date-time", param_hint="--since"
                                 ) from exc


@click.command(name="report")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="html", show_default=True)
@click.option("--since", default=None, help="Only discrepancies detected since (ISO 8601).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write here (default: standard output).")
def report_command(fmt: str, since: str | None, out: Path | None) -> None:
    """Write a discrepancy report (html, md, csv or json)."""
    from reconcile.wiring import report_windows

    settings = _root()
    start = _since(since)
    windows = report_windows(settings)
    with database(settings) as url:
        migrate.upgrade(url)
        if out is None:  # (click ends a closed pipe quietly)
            with spooled(sys.stdout) as sink:
                stream_report(url, {fmt: sink}, since=start, windows=windows)
            return
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            if out.exists() and not out.is_file():  # a device or a pipe: no rename
                with out.open("w", encoding="utf-8", newline="") as device, \
                        spooled(device) as sink:
                    stream_report(url, {fmt: sink}, since=start, windows=windows)
            else:  # a disk that fills up mid-write leaves the previous report whole
                with atomic_text(out.resolve()) as sink:
                    stream_report(url, {fmt: sink}, since=start, windows=windows)
        except OSError as exc:  # a folder that cannot be made or written: no traceback
            click.echo(f"hookledger: cannot write {out}: {exc.strerror or exc}", err=True)
            sys.exit(2)
    click.echo(f"wrote {out}", err=True)


@click.command(name="expect")
@click.argument("reference")
@click.option("--kind", type=click.Choice(["collection", "payout", "sms"]), required=True)
@click.option("--amount", default=None,
              help="Amount in TZS (exact decimal); required for a collection or payout, "
                   "none for an sms.")
@click.option("--initiated-at", default=None, help="ISO 8601 with offset (default: now).")
def expect_command(reference: str, kind: str, amount: str | None,
                   initiated_at: str | None) -> None:
    """Register an initiated payment, so that a webhook that never comes is noticed, or a
    sent SMS (its message id), shown pending until its operator report arrives."""
    from reconcile.expectations import Expectation, parse_expectation, register, registered

    settings = _root()
    try:
        data: dict[str, object] = {"reference": reference, "kind": kind, "amount": amount}
        if initiated_at is not None:  # "" is refused as the API refuses it: a script's
            data["initiated_at"] = initiated_at  # unset variable registered "now" silently
        expectation = parse_expectation(data, now=datetime.now(UTC))
    except ReconcileError as exc:
        raise click.BadParameter(str(exc)) from exc
    with database(settings) as url:
        migrate.upgrade(url)

        async def go() -> tuple[bool, Expectation]:
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                created = await register(conn, expectation)
                kept = None if created else await registered(conn, reference)
                return created, kept or expectation  # a repeat: what was kept

        try:
            created, kept = asyncio.run(go())
        except ReconcileError as exc:
            click.echo(f"hookledger: {exc}", err=True)
            sys.exit(1)
    click.echo(f"{'registered' if created else 'already registered'}: {kind} {reference} "
               f"{format(kept.amount, 'f')} TZS")  # 1e3 is 1000 TZS, never 1E+3


@click.command(name="resolve")
@click.argument("discrepancy_id")
@click.option("--reason", required=True,
              help="What was checked and found; kept with the resolution in the ledger.")
def resolve_command(discrepancy_id: str, reason: str) -> None:
    """Resolve an open discrepancy after checking it by hand (a malformed delivery, an
    event no fold could apply): appended to the ledger, shown resolved in the view."""
    from ledger.store import append_in
    from projections.projector import catch_up, connect
    from reconcile.findings import manual_resolution

    settings = _root()
    if not reason.strip():
        raise click.BadParameter("say what was checked", param_hint="--reason")
    if not jsonb_can_hold(reason):
        # bytes a terminal sent in another encoding than the locale's reach Python as lone
        # surrogates: the resolution's event could not be encoded (a traceback, exit 1)
        raise click.BadParameter("not UTF-8 text (is the terminal's encoding the locale's?)",
                                 param_hint="--reason")
    with database(settings) as url:
        migrate.upgrade(url)

        async def go() -> str:
            if not jsonb_can_hold(discrepancy_id):  # no id holds such text; unsendable
                return "unknown"
            conn = await connect(url)
            try:
                await catch_up(conn)  # the view is current
                cur = await conn.execute(
                    "SELECT subject, reference, status FROM hookledger.discrepancies "
                    "WHERE id = %s", (discrepancy_id,))
                row = await cur.fetchone()
                if row is None:
                    return "unknown"
                if row[2] == "resolved":
                    return "already resolved"
                async with conn.transaction():
                    [appended] = await append_in(conn, [manual_resolution(
                        discrepancy_id, row[0], row[1], reason.strip(), datetime.now(UTC))])
                await catch_up(conn)
                # resolved meanwhile (a reconcile pass, another person): the resolution's
                # key is the discrepancy's, so this one was not kept, nor its reason
                return "already resolved" if appended.duplicate else "resolved"
            finally:
                await conn.close()

        outcome = asyncio.run(go())
    if outcome == "unknown":
        click.echo(f"hookledger: no discrepancy {discrepancy_id}", err=True)
        sys.exit(2)
    click.echo(f"{outcome}: {discrepancy_id}")
