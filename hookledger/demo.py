"""``hookledger demo``: the whole loop on a laptop with nothing configured.

Starts the embedded PostgreSQL in a throw-away home, a hookledger service and the sandbox
API on free loopback ports, runs a faulty scenario into the service, prints what happened,
and stops everything (nothing is left running; the home is removed unless ``--keep``).

The steps after the run are a list (:data:`REPORT_STEPS`); the last one registers what the
merchant initiated as expectations, reconciles against the sandbox API, and compares what
reconciliation found with the scenario's ground truth.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import click
import psycopg

from hookledger import logs, migrate
from hookledger.app import create_app
from hookledger.database import database
from projections.projector import catch_up, connect
from reconcile.client import ReferenceClient
from reconcile.report_files import stream_report
from reconcile.runner import PassConfig, PassResult, Reconciler
from sandbox import jsonenc
from sandbox.cli import state_for
from sandbox.run import RunReport, run_plan
from sandbox.runner import Sandbox, running_sandbox, serve_asgi
from sandbox.scenario import Plan, make_plan
from sandbox.state import DEFAULT_API_KEY

GENERAL_SECRETS = {"primary": "whsec-demo-primary", "backup": "whsec-demo-backup",
                   "third": "whsec-demo-third"}
CHAT_SECRETS = {"100001": "chat-demo-1", "100002": "chat-demo-2", "100003": "chat-demo-3"}


@dataclass
class DemoContext:
    """What every report step may read."""

    database_url: str
    service_url: str
    sandbox: Sandbox
    plan: Plan
    report: RunReport


def _deliveries(ctx: DemoContext) -> list[str]:
    g, c, counts = ctx.report.general, ctx.report.chat, ctx.plan.truth["counts"]
    return [
        f"general deliveries sent:      {g['sent']} ({counts['general_events']} events, "
        f"{g['duplicate_copies_sent']} duplicate copies, "
        f"{g['bad_signature_sent']} badly signed)",
        f"general events dropped:       {counts['dropped']} (never sent; the sandbox API "
        "still knows them)",
        f"accepted:                     {g['accepted']}",
        f"duplicates folded:            {g['duplicate']}",
        f"refused:                      {g['refused']}",
        f"chat events:                  {c['events']} ({c['attempts']} attempts, "
        f"{c['lost_in_transit']} lost in transit and retried, accepted {c['accepted']}, "
        f"refused {c['refused']}, not found {c['not_found']}, dead {c['dead']})",
    ]


def _ledger(ctx: DemoContext) -> list[str]:
    with psycopg.connect(ctx.database_url) as conn:
        counts = conn.execute(
            "SELECT event_type, count(*) FROM hookledger.ledger GROUP BY event_type "
            "ORDER BY event_type").fetchall()
        rejected = conn.execute(
            "SELECT reason, count(*) FROM hookledger.rejected_deliveries GROUP BY reason "
            "ORDER BY reason").fetchall()
    lines = ["ledger events by type:"]
    lines += [f"  {event_type:<28}{n:>5}" for event_type, n in counts]
    lines.append(f"  {'total':<28}{sum(n for _, n in counts):>5}")
    lines.append("rejected deliveries: " + (", ".join(f"{r} {n}" for r, n in rejected)
                                             or "none"))
    return lines


def lost_last_states(truth: dict[str, Any]) -> set[tuple[str, str]]:
    """Collections and payouts whose LAST provider event never arrived (dropped, or sent
    only badly signed): exactly the states reconciliation must recover."""
    last: dict[tuple[str, str], dict[str, Any]] = {}
    for event in truth["general_events"]:
        subject = {"payment": "collection", "payout": "payout"}.get(event["event"].split(".")[0])
        if subject:
            last[(subject, str(event["reference"]))] = event
    return {key for key, event in last.items() if not event["delivered"]}


def register_expectations(url: str, truth: dict[str, Any], initiated_at: datetime) -> int:
    """What the merchant initiated: every collection and payout of the scenario."""
    with psycopg.connect(url, autocommit=True) as conn:
        for kind, table in (("collection", "payments"), ("payout", "payouts")):
            for reference, known in truth[table].items():
                amount = known["amount"] if known["amount"] else Decimal(1000)
                conn.execute("SELECT hookledger.expect(%s, %s, %s, %s)",
                             (reference, kind, amount, initiated_at))
    return len(truth["payments"]) + len(truth["payouts"])


def reconcile_once(url: str, api_url: str) -> PassResult:
    async def once() -> PassResult:
        async with ReferenceClient(api_url, DEFAULT_API_KEY, timeout_s=5,
                                   concurrency=16) as client:
            return await Reconciler(url, client, PassConfig()).run_pass()
    return asyncio.run(once())


def _reconciliation(ctx: DemoContext) -> list[str]:
    truth = jsonenc.loads(jsonenc.dumps(ctx.plan.truth))
    started = min(datetime.fromisoformat(truth["start"]),
                  datetime.now(UTC) - timedelta(minutes=10))
    expected = register_expectations(ctx.database_url, truth, started)
    result = reconcile_once(ctx.database_url, ctx.sandbox.url)
    with psycopg.connect(ctx.database_url) as conn:
        found = conn.execute(
            "SELECT kind, subject, reference FROM hookledger.discrepancies "
            "WHERE status = 'open'").fetchall()
    missing = {(s, r) for k, s, r in found if k == "missing_webhook"}
    lost = lost_last_states(truth)
    by_kind: dict[str, int] = {}
    for kind, _, _ in found:
        by_kind[kind] = by_kind.get(kind, 0) + 1
    lines = [f"reconciliation against the sandbox API ({expected} expectations registered):"]
    lines += ["  " + line for line in result.summary()[:1]]
    lines.append("  open discrepancies: " + (", ".join(
        f"{k} {n}" for k, n in sorted(by_kind.items())) or "none"))
    lines.append(f"  lost final states recovered: {len(missing & lost)} of {len(lost)}"
                 f" (dropped deliveries in the truth: {len(truth['dropped'])}; a dropped "
                 "event later superseded by a delivered one leaves nothing to recover)")
    if missing - lost:
        lines.append(f"  UNEXPECTED missing_webhook: {sorted(r for _, r in missing - lost)}")
    if lost - missing:
        lines.append(f"  NOT FOUND: {sorted(r for _, r in lost - missing)}")
    return lines


PROJECTION_COUNTS = [
    ("payments", "outcome || CASE WHEN recovered THEN ' (recovered)' ELSE '' END"),
    ("payouts", "outcome"),
    ("invoices", "status || CASE WHEN settled THEN ' (settled)' ELSE '' END"),
    ("sms_messages", "status"),
    ("chat_messages", "status"),
    ("chat_threads", "CASE WHEN window_open THEN 'window open' ELSE 'window closed' END"),
]


def _projections(ctx: DemoContext) -> list[str]:
    """What the views show once the projector has applied everything, recoveries included."""
    async def project_everything() -> None:
        async with await connect(ctx.database_url) as conn:
            await catch_up(conn, batch_size=1000)
    asyncio.run(project_everything())
    lines = ["projections (SQL views in schema hookledger):"]
    with psycopg.connect(ctx.database_url) as conn:
        for view, label in PROJECTION_COUNTS:
            rows = conn.execute(f"SELECT {label}, count(*) FROM hookledger.{view} "
                                "GROUP BY 1 ORDER BY 1").fetchall()
            lines.append(f"  {view:<14}" + ", ".join(f"{name} {n}" for name, n in rows))
    return lines


def _report(ctx: DemoContext) -> list[str]:
    """The finance person's HTML report, written where it outlives the demo's home."""
    path = Path.cwd() / "hookledger-demo-report.html"
    with path.open("w", encoding="utf-8") as page:
        stream_report(ctx.database_url, {"html": page})
    return [f"discrepancy report: {path}"]


REPORT_STEPS: list[Callable[[DemoContext], list[str]]] = [_deliveries, _ledger,
                                                          _reconciliation, _projections,
                                                          _report]


def _run(home: Path, seed: int) -> list[str]:
    logs.configure(fmt="console", level="error")
    # secrets in the same name=secret text form as the environment variables; never the
    # user's own provider (its API would be asked about the demo's made-up references)
    options: dict[str, Any] = {
        "home": home, "database_url": None, "api_base_url": None, "api_key": None,
        "general_secrets": ",".join(f"{k}={v}" for k, v in GENERAL_SECRETS.items()),
        "chat_secrets": ",".join(f"{k}={v}" for k, v in CHAT_SECRETS.items())}
    from hookledger.cli import load_settings  # a bad variable: a message, no traceback

    settings = load_settings(**options)
    with database(settings) as url:
        migrate.upgrade(url)
        with serve_asgi(create_app(settings, url), lifespan="on") as service_url:
            plan = make_plan("faulty", seed, endpoints=tuple(GENERAL_SECRETS),
                             phone_numbers=tuple(CHAT_SECRETS))
            state = state_for(plan, chat_secrets=CHAT_SECRETS, to=service_url)
            with running_sandbox(state=state) as api:
                report = run_plan(plan, to=service_url, general_secrets=GENERAL_SECRETS,
                                  chat_secrets=CHAT_SECRETS)
                ctx = DemoContext(url, service_url, api, plan, report)
                lines: list[str] = []
                for step in REPORT_STEPS:
                    lines += step(ctx)
    return lines


@click.command(name="demo")
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--home", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the demo's embedded database lives (default: a temporary folder, "
                   "removed afterwards).")
@click.option("--keep", is_flag=True,
              help="Keep the demo's temporary home folder afterwards (a --home is always kept).")
def demo(seed: int, home: Path | None, keep: bool) -> None:
    """Run a faulty sandbox scenario into a throw-away hookledger and summarise it."""
    started = time.monotonic()
    temporary = home is None
    root = Path(tempfile.mkdtemp(prefix="hookledger-demo-")) if temporary else home
    assert root is not None
    click.echo(f"hookledger demo: embedded database under {root}", err=True)
    try:
        lines = _run(root, seed)
    finally:
        if temporary and not keep:
            shutil.rmtree(root, ignore_errors=True)
    for line in lines:
        click.echo(line)
    click.echo(f"done in {time.monotonic() - started:.1f} s; nothing left running")


