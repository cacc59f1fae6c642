"""Event builders follow the spec's tables and its easy-to-miss amount rules."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandbox import events as ev
from sandbox import jsonenc
from sandbox.codes import GENERAL_CODES, GENERAL_EVENT_SERVICE

AT = datetime(2026, 11, 22, 5, 30, tzinfo=UTC)
INVOICE = ev.Invoice("INV-1", Decimal(50000), Decimal(20000), date(2026, 12, 31), "99123")


def test_timestamp_is_written_in_dar_es_salaam_time() -> None:
    assert ev.general_body(event="payment.confirmed", reference="R", amount=Decimal(1),
                           at=AT, transaction_id="T")["timestamp"] == "20261122083000"


def test_naive_times_are_refused() -> None:
    with pytest.raises(ev.EventError):
        ev.provider_timestamp(datetime(2026, 1, 1))


@pytest.mark.parametrize("code", sorted(GENERAL_CODES))
def test_every_code_of_the_tables_builds_with_its_event_and_service(code: int) -> None:
    event = GENERAL_CODES[code][0]
    body = ev.general_body(event=event, reference="R", amount=Decimal(0), at=AT, code=code)
    assert body["code"] == code and body["event"] == event
    assert body["service"] == GENERAL_EVENT_SERVICE[event][0]
    assert body["type"] == ("PAYOUT" if event.startswith("payout.") else "CHARGE")


def test_a_code_of_another_event_is_refused() -> None:
    with pytest.raises(ev.EventError):
        ev.general_body(event="payment.failed", reference="R", amount=Decimal(0), at=AT,
                        code=92050)


@pytest.mark.parametrize("event", ["invoice.created", "invoice.updated", "invoice.paid",
                                   "invoice.cancelled"])
def test_invoice_events_carry_the_invoice_total_in_amount(event: str) -> None:
    body = ev.invoice_event(event, INVOICE, AT, cancelled=event == "invoice.cancelled")
    assert body["amount"] == Decimal(50000) and body["reference"] == "INV-1"
    assert body["invoice"]["amountPaid"] == Decimal(20000)
    assert body["invoice"]["amountDue"] == Decimal(30000)
    assert body["service"] == "Invoicing"


def test_paid_date_is_iso_utc_with_milliseconds() -> None:
    paid = ev.Invoice("INV-1", Decimal(5), Decimal(5), date(2026, 12, 31), "9", paid_date=AT)
    assert paid.block()["paidDate"] == "2026-11-22T05:30:00.000Z"
    assert paid.block()["amountDue"] == 0


@pytest.mark.parametrize("build", [
    lambda: ev.payment_failed("R", 91053, AT),
    lambda: ev.payout_failed("R", 92057, AT),
])
def test_failures_carry_amount_zero_and_transaction_id_minus_one(build: object) -> None:
    body = build()  # type: ignore[operator]
    assert body["amount"] == 0 and body["transactionId"] == "-1"
    assert body["code"] % 100 >= 50


def test_sms_uses_message_id_as_reference_recipient_as_customer_reference_amount_zero() -> None:
    body = ev.sms_event("SMS-1", "255700000009", AT, code=94055)
    assert (body["reference"], body["customerReference"], body["amount"]) == \
        ("SMS-1", "255700000009", 0)
    assert body["event"] == "sms.failed" and body["service"] == "Bulk SMS"
    assert ev.sms_event("SMS-2", "2557", AT)["event"] == "sms.delivered"


def test_part_payment_is_payment_confirmed_91001_with_an_invoice_block() -> None:
    body = ev.payment_confirmed("C-1", Decimal(20000), AT, transaction_id="T", part=True,
                                invoice=INVOICE)
    assert (body["event"], body["code"], body["status"]) == ("payment.confirmed", 91001,
                                                             "PARTIAL")
    assert body["amount"] == Decimal(20000) and body["invoice"]["invoiceNo"] == "INV-1"


@pytest.mark.parametrize("kind", ["image", "document", "audio", "video"])
def test_inbound_media_messages_carry_a_media_id(kind: str) -> None:
    body = ev.chat_inbound(waba_id="w", phone_number_id="p", contact_wa_id="2557",
                           profile_name="A", message_id="m", at=AT, kind=kind, media_id="md")
    assert body["type"] == "message" and body["message"]["type"] == kind
    assert body["message"][kind]["id"] == "md"
    assert body["message"]["timestamp"] == str(int(AT.timestamp()))


def test_inbound_text_message_carries_its_body() -> None:
    body = ev.chat_inbound(waba_id="w", phone_number_id="p", contact_wa_id="2557",
                           profile_name="A", message_id="m", at=AT, text="hi")
    assert body["message"]["text"] == {"body": "hi"}


def test_failed_status_carries_errors_and_other_statuses_do_not() -> None:
    failed = ev.chat_status(waba_id="w", phone_number_id="p", message_id="m", status="failed",
                            at=AT, recipient_id="2557", failure_code=95063)
    assert failed["errors"][0]["code"] == 131047 and failed["errors"][0]["title"]
    read = ev.chat_status(waba_id="w", phone_number_id="p", message_id="m", status="read",
                          at=AT, recipient_id="2557")
    assert "errors" not in read and read["status"]["status"] == "read"


@given(st.decimals(allow_nan=False, allow_infinity=False, places=2,
                   min_value=Decimal("-1e12"), max_value=Decimal("1e12")))
def test_exact_json_round_trips_every_decimal_amount(amount: Decimal) -> None:
    """Money written by the sandbox reads back as the same Decimal, digit for digit."""
    text = jsonenc.dumps({"amount": amount})
    assert jsonenc.loads(text)["amount"] == amount
    assert "e" not in text.lower()  # plain digits, as the provider writes them


def test_floats_are_refused_by_the_exact_encoder() -> None:
    with pytest.raises(TypeError):
        jsonenc.dumps({"amount": 1.5})


@pytest.mark.parametrize("event", ["payment.confirmed", "chat.message.received"])
@pytest.mark.parametrize("to", ["http://127.0.0.1:1", "not-a-url"])
def test_send_to_a_receiver_that_is_not_there_says_so_without_a_traceback(
        to: str, event: str) -> None:
    from click.testing import CliRunner

    from hookledger.cli import main

    result = CliRunner().invoke(main, ["sandbox", "send", event, "--to", to,
                                       "--secret", "s", "--timeout", "2"])
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)
    assert f"could not deliver to {to}" in result.output


def test_send_of_a_chat_event_is_one_delivery_even_when_refused() -> None:
    """``sandbox send`` says it sends one signed delivery: a refused chat delivery was
    retried five more times at once (six refusals recorded for one command)."""
    import http.server
    import threading

    from click.testing import CliRunner

    from hookledger.cli import main

    received: list[str] = []

    class Refusing(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            received.append(self.headers.get("X-Service-Attempt", ""))
            body = b'{"status":"refused","reason":"unknown_phone_number"}'
            self.send_response(401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result = CliRunner().invoke(main, [
            "sandbox", "send", "chat.message.received", "--secret", "s", "--timeout", "5",
            "--to", f"http://127.0.0.1:{server.server_address[1]}"])
    finally:
        server.shutdown()
        server.server_close()
    assert result.exit_code == 1, result.output
    assert received == ["1"]
    assert "401" in result.output and "unknown_phone_number" in result.output


@pytest.mark.parametrize("start", ["yesterday", "2026-11-22T08:00:00",
                                   "0001-01-01T00:00:00+05:00", "9999-12-31T23:00:00+00:00"])
def test_run_refuses_a_start_that_is_no_instant_or_out_of_range_without_a_traceback(
        start: str) -> None:
    """``--start`` must be an ISO 8601 instant with its zone, in the years a delivery's
    ``timestamp`` can hold (1900 to 9997): text that was no date, or an instant whose
    provider time is past ``datetime``'s range, stopped the command with a traceback
    (ValueError, OverflowError) instead of saying what it takes."""
    from click.testing import CliRunner

    from hookledger.cli import main

    result = CliRunner().invoke(main, ["sandbox", "run", "--to", "http://127.0.0.1:1",
                                       "--general-secrets", "a=b", "--start", start])
    assert result.exit_code == 2, result.output
    assert "--start" in result.output
