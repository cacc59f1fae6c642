"""``hookledger sandbox ...``: serve the sandbox API, send one delivery, run a scenario."""

from __future__ import annotations

import hashlib
import sys
import time
from dataclasses import replace
from datetime import UTC, date, datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import click
import httpx

from sandbox import events as ev
from sandbox import jsonenc
from sandbox.codes import CHAT_EVENTS, DEFAULT_CODE, GENERAL_EVENT_SERVICE
from sandbox.delivery import DEFAULT_RETRY_SCALE, ChatDelivery
from sandbox.faults import FaultSettings
from sandbox.scenario import DEFAULT_PHONE_NUMBERS, DEFAULT_START, SCENARIOS, Plan, make_plan
from sandbox.signing import general_headers
from sandbox.state import DEFAULT_API_KEY, SandboxState

ALL_EVENTS = (*GENERAL_EVENT_SERVICE, *CHAT_EVENTS)


def parse_pairs(raw: str | None, what: str) -> dict[str, str]:
    """``name=secret[,name=secret]`` into an ordered dict (never echoing a secret)."""
    pairs: dict[str, str] = {}
    for item in (raw or "").split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, secret = item.partition("=")
        if not sep or not name.strip() or not secret:
            raise click.BadParameter(f"each {what} entry must look like name=secret")
        pairs[name.strip()] = secret
    return pairs


def _decimal(raw: str | None) -> Decimal | None:
    if raw is None:
        return None
    try:
        value = Decimal(raw)
    except InvalidOperation as exc:
        raise click.BadParameter(f"{raw!r} is not a number") from exc
    if not value.is_finite():
        raise click.BadParameter("amounts must be finite")
    return value


@click.group(name="sandbox")
def sandbox() -> None:
    """A local stand-in for the provider: its API, signed deliveries, faulty scenarios."""


@sandbox.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Bind address (loopback unless you really mean otherwise).")
@click.option("--port", default=8090, show_default=True, type=int)
@click.option("--api-key", default=DEFAULT_API_KEY, show_default=True,
              help="The key every API call must carry in header apiToken.")
@click.option("--state", "state_file", type=click.Path(dir_okay=False, path_type=Path),
              help="JSON file of records, media and numbers (e.g. written by 'run --state').")
@click.option("--faults", "faults_json", default=None,
              help='Initial fault switches as JSON, e.g. \'{"error_rate": 0.1}\'.')
def serve(host: str, port: int, api_key: str, state_file: Path | None,
          faults_json: str | None) -> None:
    """Serve the sandbox API until Ctrl-C."""
    import uvicorn

    from sandbox.faults import Faults
    from sandbox.server import create_app

    state = (SandboxState.load(state_file, api_key=api_key) if state_file
             else SandboxState(api_key=api_key))
    try:
        settings = FaultSettings.from_json(jsonenc.loads(faults_json)) if faults_json \
            else FaultSettings()
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--faults") from exc
    click.echo(f"sandbox API on http://{host}:{port} ({len(state.references())} records)",
               err=True)
    uvicorn.run(create_app(state, Faults(settings)), host=host, port=port, log_config=None,
                access_log=False, timeout_graceful_shutdown=1)


def build_event(event: str, *, at: datetime, reference: str | None, code: int | None,
                amount: Decimal | None, customer_reference: str | None,
                transaction_id: str | None, total: Decimal | None,
                amount_paid: Decimal | None, phone_number_id: str, message_id: str | None,
                kind: str, text: str | None, contact: str) -> dict[str, Any]:
    """The body of one delivery of ``event`` with sensible defaults. Pure."""
    stamp = at.strftime("%H%M%S")
    if event in CHAT_EVENTS:
        if event == "chat.message.received":
            mid = message_id or f"wamid.IN-{stamp}"
            return ev.chat_inbound(waba_id="waba-sandbox", phone_number_id=phone_number_id,
                                   contact_wa_id=contact, profile_name="Sandbox Customer",
                                   message_id=mid, at=at, kind=kind,
                                   text=text or "Habari from the sandbox",
                                   media_id=None if kind == "text" else f"media-{mid}")
        status = event.rsplit(".", 1)[1]
        return ev.chat_status(waba_id="waba-sandbox", phone_number_id=phone_number_id,
                              message_id=message_id or f"wamid.OUT-{stamp}", status=status,
                              at=at, recipient_id=contact,
                              failure_code=(code or 95050) if status == "failed" else None)
    code = code or DEFAULT_CODE[event]
    if event.startswith("invoice."):
        inv_total = total or amount or Decimal(50000)
        paid = amount_paid if amount_paid is not None else (
            inv_total if event == "invoice.paid" else Decimal(0))
        invoice = ev.Invoice(reference or f"INV-{stamp}", inv_total, paid, date(2026, 12, 31),
                             "99123456", paid_date=at if event == "invoice.paid" else None)
        return ev.invoice_event(event, invoice, at, cancelled=event == "invoice.cancelled")
    if event.startswith("sms."):
        return ev.sms_event(reference or f"SMS-{stamp}", customer_reference or "255712345678",
                            at, code=code if event == "sms.failed" else 94000)
    failure = code % 100 >= 50
    value = Decimal(0) if failure else (amount if amount is not None else Decimal(1000))
    txn = "-1" if failure else (transaction_id or f"TX-{stamp}")
    return ev.general_body(event=event, reference=reference or f"REF-{stamp}", amount=value,
                           at=at, code=code, customer_reference=customer_reference,
                           transaction_id=txn)


@sandbox.command()
@click.argument("event", type=click.Choice(ALL_EVENTS))
@click.option("--to", required=True, help="hookledger's base URL, e.g. http://127.0.0.1:8080")
@click.option("--secret", default=None, help="Signing secret (general webhook or chat number).")
@click.option("--endpoint", default="primary", show_default=True,
              help="General webhook name: posts to {to}/webhooks/general/{endpoint}.")
@click.option("--code", type=int, default=None)
@click.option("--amount", default=None)
@click.option("--reference", default=None)
@click.option("--customer-reference", default=None)
@click.option("--transaction-id", default=None)
@click.option("--total", default=None, help="Invoice total (invoice events).")
@click.option("--amount-paid", default=None, help="Invoice amount paid (invoice events).")
@click.option("--phone-number-id", default=DEFAULT_PHONE_NUMBERS[0], show_default=True)
@click.option("--message-id", default=None)
@click.option("--kind", type=click.Choice(["text", "image", "document", "audio", "video"]),
              default="text", show_default=True)
@click.option("--text", default=None)
@click.option("--contact", default="255700000001", show_default=True)
@click.option("--timeout", default=30.0, show_default=True)
def send(event: str, to: str, secret: str | None, endpoint: str, code: int | None,
         amount: str | None, reference: str | None, customer_reference: str | None,
         transaction_id: str | None, total: str | None, amount_paid: str | None,
         phone_number_id: str, message_id: str | None, kind: str, text: str | None,
         contact: str, timeout: float) -> None:
    """Send one signed delivery of EVENT to a running hookledger and print its answer."""
    try:
        body = build_event(event, at=datetime.now(UTC), reference=reference, code=code,
                           amount=_decimal(amount), customer_reference=customer_reference,
                           transaction_id=transaction_id, total=_decimal(total),
                           amount_paid=_decimal(amount_paid), phone_number_id=phone_number_id,
                           message_id=message_id, kind=kind, text=text, contact=contact)
    except ev.EventError as exc:
        raise click.UsageError(str(exc)) from exc
    raw = jsonenc.encode(body)
    base = to.rstrip("/")
    if event in CHAT_EVENTS:
        # one attempt, signed as the platform signs its first: retries are the scenario
        # runner's business (deliver_chat would retry a refusal five times more at once)
        delivery = ChatDelivery(f"dlv-cli-{hashlib.sha256(raw).hexdigest()[:16]}",
                                phone_number_id, f"{base}/webhooks/chat/{phone_number_id}",
                                raw, secret or "chat-secret")
        url, headers = delivery.url, delivery.headers(1, int(time.time()))
    else:
        url = f"{base}/webhooks/general/{endpoint}"
        headers = general_headers(secret or "whsec-sandbox", raw)
    try:
        response = httpx.post(url, content=raw, headers=headers, timeout=timeout)
    except httpx.HTTPError as exc:  # hookledger not there: say so, no traceback
        raise click.ClickException(f"could not deliver to {base}: {exc}") from exc
    status, text_answer = response.status_code, response.text
    click.echo(raw.decode("utf-8"), err=True)
    click.echo(f"{status} {text_answer}")
    if not 200 <= status < 300:
        sys.exit(1)


# the years hookledger reads a ``timestamp`` in (``ledger.instants``, not imported: the
# sandbox stands for the provider and needs none of hookledger)
START_RANGE = (datetime(1900, 1, 1, tzinfo=UTC), datetime(9998, 1, 1, tzinfo=UTC))


def _start(raw: str) -> datetime:
    """``--start``: an instant with its zone, in the years a ``timestamp`` holds (text
    that was none, or one whose provider time overflowed, ended in a traceback)."""
    if raw == "now":
        return datetime.now(UTC).replace(microsecond=0)
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        raise click.BadParameter("an ISO 8601 date-time with its zone, e.g. "
                                 "2026-11-22T08:00:00+03:00, or 'now'",
                                 param_hint="--start") from None
    if value.tzinfo is None:
        raise click.BadParameter("give a zone, e.g. 2026-11-22T08:00:00+03:00",
                                 param_hint="--start")
    if not START_RANGE[0] <= value < START_RANGE[1]:  # aware: compared as instants
        raise click.BadParameter("must be between 1900 and 9997", param_hint="--start")
    return value


def state_for(plan: Plan, *, api_key: str = DEFAULT_API_KEY,
              chat_secrets: dict[str, str] | None = None, to: str | None = None
              ) -> SandboxState:
    """The sandbox API's records for a plan (what its reference API must answer)."""
    state = SandboxState(api_key=api_key)
    for reference, record in plan.records.items():
        state.put_record(reference, record)
    for media_id, kind in plan.media.items():
        state.issue_media(media_id, kind)
    for pn, secret in (chat_secrets or {}).items():
        state.connect_number(pn, secret=secret,
                             webhook_url=f"{to.rstrip('/')}/webhooks/chat/{pn}" if to else None)
    return state


@sandbox.command()
@click.option("--scenario", type=click.Choice(sorted(SCENARIOS)), default="faulty",
              show_default=True)
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--to", required=True, help="hookledger's base URL.")
@click.option("--general-secrets", required=True, help="name=secret,... (1 to 3 webhooks).")
@click.option("--chat-secrets", default="", help="phoneNumberId=secret,... (chat numbers).")
@click.option("--truth", "truth_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--state", "state_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the sandbox API's state, for 'sandbox serve --state'.")
@click.option("--start", default=DEFAULT_START.isoformat(), show_default=True,
              help="The scenario's clock start (ISO 8601 with zone) or 'now'.")
@click.option("--size", type=int, default=1, show_default=True)
@click.option("--retry-scale", type=float, default=DEFAULT_RETRY_SCALE, show_default=True,
              help="Chat retry schedule multiplier (1e-4: 1 minute -> 6 ms).")
@click.option("--drop", type=float, default=None, help="Fraction of general events dropped.")
@click.option("--duplicate", type=float, default=None)
@click.option("--delay", type=float, default=None)
@click.option("--reorder", type=float, default=None)
@click.option("--bad-signature", type=float, default=None)
@click.option("--api-port", type=int, default=0, help="Port of the sandbox API during the run.")
def run(scenario: str, seed: int, to: str, general_secrets: str, chat_secrets: str,
        truth_file: Path | None, state_file: Path | None, start: str, size: int,
        retry_scale: float, drop: float | None, duplicate: float | None, delay: float | None,
        reorder: float | None, bad_signature: float | None, api_port: int) -> None:
    """Run a deterministic scenario into hookledger; write the ground truth."""
    from sandbox.run import run_plan
    from sandbox.runner import running_sandbox

    general = parse_pairs(general_secrets, "--general-secrets")
    if not 1 <= len(general) <= 3:
        raise click.BadParameter("give 1 to 3 general webhooks", param_hint="--general-secrets")
    chat = parse_pairs(chat_secrets, "--chat-secrets")
    rates = SCENARIOS[scenario]
    overrides = {k: v for k, v in {"drop": drop, "duplicate": duplicate, "delay": delay,
                                   "reorder": reorder, "bad_signature": bad_signature}.items()
                 if v is not None}
    rates = replace(rates, **overrides)  # type: ignore[arg-type]
    plan = make_plan(scenario, seed, start=_start(start), endpoints=tuple(general),
                     phone_numbers=tuple(chat) or DEFAULT_PHONE_NUMBERS, rates=rates,
                     size=size)
    state = state_for(plan, chat_secrets=chat, to=to)
    if state_file:
        state.save_to(state_file)
    started = time.monotonic()
    with running_sandbox(state=state, port=api_port) as api:
        click.echo(f"sandbox API of this run, until it ends: {api.url} (to reconcile "
                   f"afterwards, keep its records with --state FILE and serve them with "
                   f"'hookledger sandbox serve --state FILE')", err=True)
        report = run_plan(plan, to=to, general_secrets=general, chat_secrets=chat,
                          retry_scale=retry_scale)
    if truth_file:
        truth_file.write_text(jsonenc.dumps(plan.truth), encoding="utf-8")
    summary = {"scenario": scenario, "seed": seed, "planned": plan.truth["counts"],
               "answers": report.as_json(), "seconds": Decimal(f"{time.monotonic() - started:.3f}")}
    click.echo(jsonenc.dumps(summary))
