"""Reading verified general bodies: normalised facts, dedupe key, and refusals."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingest.errors import BodyError
from ingest.general_body import (
    MALFORMED_EVENT_TYPE,
    UNRECOGNISED_EVENT_TYPE,
    dedupe_key,
    malformed_key,
    read_general,
    read_general_or_malformed,
)
from ingest.json_body import number_text, parse_object

EAT = ZoneInfo("Africa/Dar_es_Salaam")


def body(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "timestamp": "20261122083000", "reference": "REF-1", "customerReference": "order-9",
        "amount": Decimal("15000.50"), "type": "CHARGE", "merchantAccountId": "shop",
        "status": "SUCCESSFUL", "transactionId": "TX1", "event": "payment.confirmed",
        "service": "Collection", "message": "Paid", "code": 91000, "payloadSignature": "x",
        "customer": {"firstname": "A", "lastname": "B", "phoneNumber": "255712345678",
                     "mno": "Op"},
    }
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


def test_timestamp_is_read_in_the_provider_zone_and_kept_raw() -> None:
    read = read_general(body(), EAT)
    assert read.occurred_at is not None and read.occurred_at.utcoffset().total_seconds() == 3 * 3600  # type: ignore[union-attr]
    assert read.occurred_at.isoformat() == "2026-11-22T08:30:00+03:00"
    assert read.facts["timestamp_raw"] == "20261122083000"


def test_amount_is_exact_text_never_float() -> None:
    parsed, _ = parse_object(b'{"event":"payment.confirmed","reference":"R","amount":0.1,'
                             b'"timestamp":"20260101000000","code":91000}')
    assert read_general(parsed, EAT).facts["amount"] == "0.1"


@pytest.mark.parametrize("tx", ["-1", -1, " -1 ", "", "  "])
def test_transaction_id_minus_one_is_absent(tx: Any) -> None:
    read = read_general(body(event="payment.failed", code=91051, amount=0, transactionId=tx), EAT)
    assert read.facts["transaction_id"] is None
    assert read.facts["outcome"] == "failure"


@pytest.mark.parametrize(("event", "code", "outcome"), [
    ("payment.confirmed", 91000, "success"),
    ("payment.confirmed", 91001, "success"),
    ("payment.refunded", 91010, "refunded"),
    ("payment.failed", 91062, "failure"),
    ("payment.failed", 91099, "failure"),      # unlisted: read by its band
    ("payment.confirmed", 91042, "success"),   # unlisted success band
    ("payout.approved", 92002, "pending"),
    ("payout.failed", 92057, "failure"),
    ("sms.failed", 94077, "failure"),
    ("payment.confirmed", None, "success"),
    ("payout.failed", None, "failure"),
])
def test_outcome_comes_from_the_code_band_then_the_event(event: str, code: int | None,
                                                          outcome: str) -> None:
    assert read_general(body(event=event, code=code), EAT).facts["outcome"] == outcome


def test_a_failure_code_on_a_confirmed_event_is_a_failure_and_flagged() -> None:
    facts = read_general(body(code=91055), EAT).facts
    assert facts["outcome"] == "failure" and facts["code_event_conflict"] is True


@pytest.mark.parametrize(("event", "code", "outcome"), [
    ("payment.failed", 91000, "success"),   # its own service's code: the code decides
    ("payout.failed", 92000, "success"),
    ("payment.failed", 91042, "success"),   # unlisted, its own service
    # another service's success says nothing of this payment: it stays failed (it read as
    # a success, and a merchant shipping on outcome = success shipped unpaid goods)
    ("payment.failed", 92000, "failure"),
    ("payout.failed", 91000, "failure"),
    ("sms.failed", 91000, "failure"),
    ("payment.failed", 93042, "failure"),
])
def test_a_success_code_on_a_failed_event_counts_only_from_the_events_service(
        event: str, code: int, outcome: str) -> None:
    facts = read_general(body(event=event, code=code, amount=0), EAT).facts
    assert facts["outcome"] == outcome and facts["code_event_conflict"] is True


@pytest.mark.parametrize(("event", "code", "outcome"), [
    ("payout.failed", 92002, "pending"),       # approved and debited: not completed
    ("payout.confirmed", 92002, "pending"),
    ("payment.confirmed", 91010, "refunded"),  # the money went back to the customer
    ("payment.failed", 91010, "refunded"),
    # a success code never makes a refund or an approval settled money
    ("payment.refunded", 91000, "refunded"),
    ("payment.refunded", 91001, "refunded"),
    ("payout.approved", 92000, "pending"),
])
def test_a_listed_code_keeps_its_meaning_against_the_event_and_is_flagged(
        event: str, code: int, outcome: str) -> None:
    """A published code keeps its meaning for ever: 92002 on ``payout.failed`` is an
    approved payout still in flight, not a completed one, and a person is told. Where the
    two disagree, the reading that does not call money settled wins."""
    facts = read_general(body(event=event, code=code), EAT).facts
    assert facts["outcome"] == outcome and facts["code_event_conflict"] is True


@pytest.mark.parametrize(("event", "code", "outcome"), [
    ("payout.confirmed", 91010, "success"),    # a refund's code on a payout
    ("payment.confirmed", 92002, "success"),   # a payout approved, on a payment
    ("payment.confirmed", 93003, "success"),   # an invoice cancelled, on a payment
    ("payment.confirmed", 95063, "failure"),   # failure band: the band decides, as ever
    ("sms.delivered", 92002, "success"),
    ("invoice.paid", 91010, "success"),        # a refund's code on a paid invoice
    ("invoice.cancelled", 91000, "success"),   # a payment's, on a cancellation
    # another invoice event's code: every invoice code reads as a success, yet each names
    # its own event (a receiver branching on 93003 cancels the invoice)
    ("invoice.paid", 93003, "success"),
    ("invoice.cancelled", 93002, "success"),
    ("invoice.updated", 93003, "success"),
    ("invoice.paid", 93001, "success"),
])
def test_a_listed_code_of_another_kind_of_event_is_flagged_and_read_by_the_event(
        event: str, code: int, outcome: str) -> None:
    """Not this event's code, and its own event says something else: read by the event name
    (another service's code says nothing of this payment), and a person is told."""
    facts = read_general(body(event=event, code=code), EAT).facts
    assert facts["outcome"] == outcome and facts["code_event_conflict"] is True


@pytest.mark.parametrize(("event", "code"), [
    ("payment.confirmed", 91000), ("payment.confirmed", 91001), ("payment.confirmed", 91042),
    ("payout.approved", 92002), ("payout.approved", 92001), ("payout.confirmed", 92000),
    ("payment.refunded", 91010), ("payout.failed", 92057), ("payment.confirmed", 92000),
    # invoices report a payment's outcome with the Collection codes (the spec)
    ("invoice.updated", 91001), ("invoice.paid", 91000), ("payment.confirmed", 93002),
    # a failure's reason keeps its last two digits across services
    ("payout.failed", 91057), ("payment.failed", 92057), ("payment.failed", 94050),
])
def test_a_code_that_agrees_with_its_event_is_not_flagged(event: str, code: int) -> None:
    assert read_general(body(event=event, code=code), EAT).facts["code_event_conflict"] is False


def test_invoice_block_amounts_are_read_from_the_block() -> None:
    invoice = {"invoiceNo": "INV-7", "total": 100000, "amountPaid": Decimal("40000.00"),
               "amountDue": Decimal("60000.00"), "currency": "TZS", "dueDate": "2026-12-01",
               "paymentReference": "991234"}
    facts = read_general(body(event="invoice.updated", code=93001, reference="INV-7",
                              amount=100000, service="Invoicing", invoice=invoice), EAT).facts
    assert facts["amount"] == "100000"  # the TOTAL, not money received
    assert facts["invoice"]["amount_paid"] == "40000.00"
    assert facts["invoice"]["amount_due"] == "60000.00"
    assert facts["invoice"]["total"] == "100000" and facts["invoice"]["invoice_no"] == "INV-7"
    assert facts["invoice"]["payment_reference"] == "991234"
    assert facts["invoice"]["due_date"] == "2026-12-01" and facts["invoice"]["paid_date"] is None
    paid = read_general(body(event="invoice.paid", code=93002, service="Invoicing",
                             invoice={**invoice, "paidDate": "2026-11-22"}), EAT).facts
    assert paid["invoice"]["paid_date"] == "2026-11-22"


def test_an_invoice_block_that_is_not_an_object_is_a_body_error() -> None:
    """The reconciler reads a record's block with the webhook's reader: the same refusal."""
    from ingest.general_body import read_invoice_block
    for value in ("INV-1", [], None, 5):
        with pytest.raises(BodyError) as err:
            read_invoice_block(value)
        assert err.value.reason == "invalid_field"
    assert read_invoice_block({"invoiceNo": "I", "dueDate": 5, "paidDate": {}}) == (
        {"invoice_no": "I", "total": None, "amount_paid": None, "amount_due": None,
         "currency": None, "due_date": "5", "paid_date": None, "payment_reference": None},
        ["invoice.paidDate"])


def test_a_part_payment_may_carry_an_invoice_block() -> None:
    invoice = {"invoiceNo": "INV-7", "total": 100000, "amountPaid": 40000, "amountDue": 60000}
    read = read_general(body(code=91001, amount=40000, invoice=invoice), EAT)
    assert read.stream == "collection:REF-1"
    assert read.facts["invoice"]["invoice_no"] == "INV-7"


@pytest.mark.parametrize("payload", [
    {"event": "webhook.test"}, {"ping": True}, {"event": "payment.exploded", "reference": "R"},
    {"event": 42}, {"event": ["payment.confirmed"]}, {"event": {"payment.confirmed": 1}},
])
def test_unknown_events_and_pings_are_kept_flagged(payload: dict[str, Any]) -> None:
    read = read_general(payload, EAT)
    assert read.event_type == UNRECOGNISED_EVENT_TYPE
    assert read.facts["recognised"] is False


@pytest.mark.parametrize(("overrides", "reason"), [
    ({"reference": None}, "missing_field"),
    ({"reference": 12}, "invalid_field"),
    ({"reference": "  "}, "invalid_field"),
    ({"amount": "1000"}, "invalid_field"),
    ({"amount": True}, "invalid_field"),
    ({"amount": -5}, "invalid_field"),
    ({"amount": Decimal("1e30")}, "invalid_field"),
    ({"amount": None}, "missing_field"),
    ({"timestamp": "2026-11-22"}, "invalid_field"),
    ({"timestamp": "20261322083000"}, "invalid_field"),
    ({"code": "91000"}, "invalid_field"),
    ({"code": 123}, "invalid_field"),
    ({"code": Decimal("91000.5")}, "invalid_field"),
    ({"code": Decimal("123.0")}, "invalid_field"),
    ({"invoice": {"amountDue": "0"}}, "invalid_field"),
    ({"invoice": "INV-1"}, "invalid_field"),
    ({"invoice": {"invoiceNo": 7}}, "invalid_field"),  # decided on: read strictly
    ({"reference": "R" * 513}, "invalid_field"),
    ({"amount": Decimal("1E16")}, "invalid_field"),
    ({"amount": Decimal("1E-16")}, "invalid_field"),  # too small is out of range too
    ({"code": 89999}, "invalid_field"),
    ({"code": 100000}, "invalid_field"),
    ({"timestamp": "2026112208300"}, "invalid_field"),  # 13 digits
    ({"timestamp": "202611220830000"}, "invalid_field"),  # 15 digits
    ({"timestamp": "２０２６１１２２０８３０００"}, "invalid_field"),  # full-width digits
])
def test_a_known_event_with_wrong_fields_is_kept_as_malformed(overrides: dict[str, Any],
                                                              reason: str) -> None:
    payload = body(**overrides)  # None removes the field
    with pytest.raises(BodyError) as err:
        read_general(payload, EAT)
    assert err.value.reason == reason
    kept = read_general_or_malformed(payload, EAT)
    assert kept.event_type == MALFORMED_EVENT_TYPE and kept.occurred_at is None
    # one event through all three URLs (only payloadSignature differs), never the key a
    # readable copy of the same event would have
    assert kept.dedupe_key == malformed_key({**payload, "payloadSignature": "other"})
    assert kept.dedupe_key != dedupe_key(payload)
    assert kept.facts["reason"] == reason and kept.facts["detail"] == err.value.detail
    assert kept.facts["recognised"] is False and kept.facts["malformed"] is True
    assert kept.facts["event"] == payload["event"]
    assert kept.facts["subject"] == "collection"
    reference = payload.get("reference")
    assert kept.facts["reference"] == (reference if isinstance(reference, str)
                                       and reference.strip() and len(reference) <= 512
                                       else None)
    assert kept.stream == ("collection:REF-1" if kept.facts["reference"] == "REF-1"
                           else f"malformed:{kept.dedupe_key[18:34]}")


@pytest.mark.parametrize(("overrides", "unread", "read_as"), [
    ({"customer": "A B"}, ["customer"], {"customer": {}}),
    ({"transactionId": {"x": 1}}, ["transactionId"], {"transaction_id": None}),
    ({"customerReference": 4471}, [], {"customer_reference": "4471"}),
    ({"customer": {"firstname": "A", "phoneNumber": 255712345678}}, [],
     {"customer": {"first_name": "A", "last_name": None, "phone_number": "255712345678",
                   "mno": None}}),
    ({"message": "x" * 600}, [], {"message": "x" * 600}),
    ({"message": "x" * 5000}, ["message"], {"message": None}),
    ({"status": ["SUCCESSFUL"], "type": {"a": 1}}, ["type", "status"],
     {"status": None, "type": None}),
    ({"transactionId": 987654321}, [], {"transaction_id": "987654321"}),
    ({"transactionId": -1}, [], {"transaction_id": None}),
    ({"type": True, "customerReference": False}, ["customerReference", "type"],
     {"type": None, "customer_reference": None}),  # a boolean is not a number's text
    ({"message": "x" * 4096}, [], {"message": "x" * 4096}),
    ({"message": "x" * 4097}, ["message"], {"message": None}),
    ({"merchantAccountId": "m" * 512}, [], {"merchant_account_id": "m" * 512}),
    ({"merchantAccountId": "m" * 513}, ["merchantAccountId"], {"merchant_account_id": None}),
    ({"invoice": {"invoiceNo": "INV-1", "amountPaid": 400, "amountDue": 600,
                  "currency": 834, "dueDate": ["2026-12-31"]}}, ["invoice.dueDate"],
     {"invoice": {"invoice_no": "INV-1", "total": None, "amount_paid": "400",
                  "amount_due": "600", "currency": "834", "due_date": None, "paid_date": None,
                  "payment_reference": None}}),
])
def test_a_field_that_only_describes_never_costs_the_delivery(
        overrides: dict[str, Any], unread: list[str], read_as: dict[str, Any]) -> None:
    """A payment whose customer's phone number came as a JSON number, or whose message is
    long, was kept as malformed and missing from every view. Such a field is read as its
    text, or left out and named; the payment is read and projected as any other."""
    payload = body(**overrides)
    read = read_general(payload, EAT)
    assert read.event_type == "payment.confirmed"
    assert read.facts["outcome"] == "success" and read.facts["amount"] == "15000.50"
    assert read.facts.get("unread_fields", []) == unread
    for name, value in read_as.items():
        assert read.facts[name] == value
    assert read.dedupe_key == dedupe_key(payload)


def test_an_invoice_events_status_word_decides_cancellation_so_stays_strict() -> None:
    """Left out when unreadable, an invoice.updated's status saying CANCELLED would be lost
    silently; kept as malformed it is reported for a person to check."""
    invoice = {"invoiceNo": "INV-1", "total": 900, "amountPaid": 0, "amountDue": 900}
    payload = body(event="invoice.updated", code=93001, service="Invoicing", invoice=invoice,
                   status=["CANCELLED"])
    with pytest.raises(BodyError):
        read_general(payload, EAT)
    assert read_general_or_malformed(payload, EAT).event_type == MALFORMED_EVENT_TYPE


@pytest.mark.parametrize("event", ["invoice.created", "invoice.paid", "invoice.cancelled"])
def test_every_invoice_events_status_word_is_read_strictly(event: str) -> None:
    """Not only ``invoice.updated``: on any invoice event an unreadable status is malformed."""
    invoice = {"invoiceNo": "INV-1", "total": 900, "amountPaid": 0, "amountDue": 900}
    payload = body(event=event, code=None, service="Invoicing", invoice=invoice,
                   status=["CANCELLED"])
    with pytest.raises(BodyError):
        read_general(payload, EAT)


@pytest.mark.parametrize(("code", "known"), [(91000, True), (93003, True), (91099, False),
                                             (90000, False), (99999, False), (None, False)])
def test_code_known_says_whether_the_code_is_in_the_spec_table(code: int | None,
                                                              known: bool) -> None:
    """Every five-digit 9xxxx code is read, and ``code_known`` tells a listed one apart."""
    facts = read_general(body(code=code), EAT).facts
    assert facts["code"] == code and facts["code_known"] is known


@pytest.mark.parametrize("amount", [Decimal("999999999999999.99"), Decimal("1E-15"),
                                    Decimal("0.000000000000001")])
def test_amounts_within_moneys_range_are_read_exactly(amount: Decimal) -> None:
    """Fifteen digits either side of the point are money; only past them is out of range."""
    assert read_general(body(amount=amount), EAT).facts["amount"] == format(amount, "f")


def test_a_reference_of_the_longest_allowed_length_is_read() -> None:
    read = read_general(body(reference="R" * 512), EAT)
    assert read.stream == "collection:" + "R" * 512


def test_an_event_whose_every_field_is_readable_names_no_unread_field() -> None:
    assert "unread_fields" not in read_general(body(), EAT).facts


def test_a_well_formed_event_is_read_the_same_either_way() -> None:
    payload = body()
    assert read_general_or_malformed(payload, EAT) == read_general(payload, EAT)


def test_a_byte_order_mark_before_the_object_is_ignored() -> None:
    """RFC 8259 lets a reader ignore one; refused, a signed delivery the general system
    never sends again was lost over three bytes. The raw body keeps them (its signature)."""
    assert parse_object(b'\xef\xbb\xbf{"a": 1}') == ({"a": 1}, '{"a": 1}')
    for raw, reason in ((b"\xef\xbb\xbf\xef\xbb\xbf{}", "invalid_json"),
                        (b"\xef\xbb\xbf[1]", "not_an_object"), (b"\xef\xbb\xbf", "invalid_json")):
        with pytest.raises(BodyError) as err:
            parse_object(raw)
        assert err.value.reason == reason


@pytest.mark.parametrize(("raw", "reason"), [
    (b"[1,2]", "not_an_object"),
    (b'"text"', "not_an_object"),
    (b"{", "invalid_json"),
    (b"", "invalid_json"),
    (b'{"a": NaN}', "invalid_json"),
    (b'{"a": Infinity}', "invalid_json"),
    (b'{"a": 1, "a": 2}', "duplicate_json_key"),
    (b'{"a": "\\u0000"}', "nul_character"),
    (b'{"a": "\\ud800"}', "invalid_unicode"),
    (b'{"a": "\xff"}', "invalid_utf8"),
    (b'{"a": 1e999999}', "number_out_of_range"),
    (b'{"a": ' + b"9" * 5000 + b"}", "number_out_of_range"),
    (b'{"a": -' + b"9" * 1000 + b"}", "number_out_of_range"),
    (b'{"a": 1.' + b"0" * 1001 + b"}", "number_out_of_range"),
    (b'{"a": 1E-1001}', "number_out_of_range"),
    (b'{"a":' + b"[" * 100 + b"]" * 100 + b"}", "too_deep"),
    (b'{"a":' + b"[" * 100000 + b"]" * 100000 + b"}", "too_deep"),
])
def test_strict_json_refusals(raw: bytes, reason: str) -> None:
    with pytest.raises(BodyError) as err:
        parse_object(raw)
    assert err.value.reason == reason


# -- the dedupe key ------------------------------------------------------------------------

def test_the_same_event_through_another_endpoint_or_reworded_has_the_same_key() -> None:
    a = body()
    b = body(message="Imelipwa", payloadSignature="other")
    assert dedupe_key(a) == dedupe_key(b)


def test_the_same_state_at_another_time_is_a_new_event() -> None:
    """An invoice back at an earlier state (1000, 1200, then 1000 again) is current, not a
    copy: only its time tells the third save from the first."""
    assert dedupe_key(body(timestamp="20261122110000")) != dedupe_key(body())


def test_the_key_hashes_the_documented_canonical_form() -> None:
    """Keys in the ledger were made from this exact text; written out here by hand (numbers
    as ``{"#n": text}``, booleans and null as themselves, volatile fields left out)."""
    import hashlib
    payload = {"event": "payment.confirmed", "amount": Decimal("1000.00"), "code": 91000,
               "ok": True, "none": None, "list": [1, False, "é"], "message": "m",
               "payloadSignature": "s", "timestamp": "20261122083000"}
    canonical = ('{"amount":{"#n":"1000"},"code":{"#n":"91000"},"event":"payment.confirmed",'
                 '"list":[{"#n":"1"},false,"é"],"none":null,"ok":true,'
                 '"timestamp":"20261122083000"}').encode()
    assert dedupe_key(payload) == "general:" + hashlib.sha256(canonical).hexdigest()


def test_a_boolean_and_the_number_it_equals_are_different_events() -> None:
    assert dedupe_key({"flag": True}) != dedupe_key({"flag": 1})
    assert dedupe_key({"flag": False}) != dedupe_key({"flag": 0})


def test_number_formatting_does_not_change_the_key() -> None:
    assert dedupe_key(body(amount=Decimal("1000"))) == dedupe_key(body(amount=Decimal("1000.00")))


@pytest.mark.parametrize("change", [
    {"event": "payment.refunded", "code": 91010},
    {"status": "PARTIAL", "code": 91001},
    {"amount": Decimal("15000.51")},
    {"transactionId": "TX2"},
    {"invoice": {"amountPaid": 1}},
])
def test_a_change_of_state_on_the_same_reference_is_a_new_event(change: dict[str, Any]) -> None:
    assert dedupe_key(body(**change)) != dedupe_key(body())


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=10,
)


@given(st.dictionaries(st.text(max_size=8), json_values, max_size=6))
def test_the_key_does_not_depend_on_field_order(payload: dict[str, Any]) -> None:
    reordered = dict(reversed(list(payload.items())))
    assert dedupe_key(payload) == dedupe_key(reordered)
    assert dedupe_key(json.loads(json.dumps(payload))) == dedupe_key(payload)


def test_amounts_differing_past_the_28th_digit_are_different_events() -> None:
    """The default decimal context rounds to 28 digits: these two had one key, and the
    second delivery was answered as a duplicate and never kept."""
    low = body(amount=Decimal("1000.0000000000000000000000001"))
    high = body(amount=Decimal("1000.0000000000000000000000002"))
    assert dedupe_key(low) != dedupe_key(high)
    assert dedupe_key(high) == dedupe_key(body(amount=Decimal("1000.00000000000000000000000020")))


@given(st.decimals(allow_nan=False, allow_infinity=False, places=None)
       | st.integers(-10**27, 10**27))
def test_numbers_of_up_to_28_digits_keep_the_spelling_keys_were_made_with(
        value: Decimal | int) -> None:
    """Keys of events already in the ledger hash this spelling: a change would let a
    redelivery of one of them in as new."""
    if isinstance(value, Decimal) and len(value.as_tuple().digits) > 28:
        return
    assert number_text(value) == format(Decimal(value).normalize(), "f")


UNSTORABLE_WITH = ('{{"timestamp":"20261122083000","reference":"R-DUPKEY","amount":1000,'
                   '"status":"SUCCESSFUL","status":"SUCCESSFUL","event":"payment.confirmed",'
                   '"code":91000,"message":"Paid","payloadSignature":{}}}')


@given(st.text(), st.text(), st.booleans())
def test_an_unstorable_copy_through_each_url_is_one_event_whatever_its_signature_holds(
        first: str, second: str, escape_slashes: bool) -> None:
    """Only ``payloadSignature`` differs between the URLs' copies: however their encoder
    spells it (``\\/`` for a base64 ``/``, escaped quotes, unicode escapes), one key."""
    from ingest.general_body import unstorable_general

    def copy(signature: str) -> bytes:
        text = json.dumps(signature)
        return UNSTORABLE_WITH.format(text.replace("/", "\\/") if escape_slashes
                                      else text).encode()

    error = BodyError("duplicate_json_key", "key 'status' appears twice")
    keys = {unstorable_general(copy(s), error).dedupe_key for s in (first, second)}
    assert len(keys) == 1
    other = UNSTORABLE_WITH.replace("R-DUPKEY", "R-OTHER").format('"x"').encode()
    assert unstorable_general(other, error).dedupe_key not in keys


def test_malformed_copies_differing_in_their_message_are_two_events() -> None:
    """Only ``payloadSignature`` is left out of a malformed copy's key: reworded, it is
    another copy the provider sent, kept as such (see :func:`malformed_key`)."""
    payload = body(amount="1000")
    assert malformed_key(payload) != malformed_key({**payload, "message": "Imelipwa"})
    assert malformed_key(payload) == malformed_key({**payload, "payloadSignature": "other"})


def test_an_unrecognised_event_is_filed_by_reference_or_by_its_digest() -> None:
    """A usable reference names the stream; none (or one too long to be real) gives the
    first sixteen hex digits of the body's digest, as a malformed copy's does."""
    named = read_general({"event": "webhook.test", "reference": "R-9"}, EAT)
    assert named.stream == "unrecognised:R-9" and named.facts["reference"] == "R-9"
    for payload in ({"event": "webhook.test"}, {"event": "webhook.test", "reference": "R" * 513},
                    {"event": "webhook.test", "reference": " "}):
        read = read_general(payload, EAT)
        assert read.facts["reference"] is None
        assert read.stream == "unrecognised:" + read.dedupe_key.removeprefix("general:")[:16]
    assert read_general({"event": "webhook.test", "reference": "R" * 512},
                        EAT).stream == "unrecognised:" + "R" * 512


def test_an_unstorable_copy_is_flagged_and_filed_with_its_subject_only_when_listed() -> None:
    """Strict reading refused it: flagged ``unstorable``; an event not in the table has no
    subject, so its copy is filed under ``malformed:`` and its reference."""
    from ingest.general_body import unstorable_general

    error = BodyError("duplicate_json_key", "key 'status' appears twice")
    listed = unstorable_general(UNSTORABLE_WITH.format('"x"').encode(), error)
    assert listed.facts["unstorable"] is True and listed.stream == "collection:R-DUPKEY"
    unlisted = unstorable_general(
        UNSTORABLE_WITH.replace("payment.confirmed", "payment.exploded").format('"x"').encode(),
        error)
    assert unlisted.facts["subject"] is None and unlisted.stream == "malformed:R-DUPKEY"
    readable = read_general_or_malformed(body(amount="1000"), EAT)
    assert "unstorable" not in readable.facts


def test_a_php_escaped_base64_signature_is_blanked_whole() -> None:
    from ingest.general_body import unstorable_general

    error = BodyError("duplicate_json_key", "key 'status' appears twice")
    primary = UNSTORABLE_WITH.format('"aGVsbG8\\/d29ybGQ+MQ=="').encode()
    backup = UNSTORABLE_WITH.format('"Zm9vYmFy\\/YmF6+Mg=="').encode()
    assert unstorable_general(primary, error).dedupe_key == \
        unstorable_general(backup, error).dedupe_key


@pytest.mark.parametrize(("spelled", "kept"), [
    ("0.00", "0.00"), ("0E-999", "0"), ("0e20", "0"), ("0.0000000000000000000000", "0")])
def test_a_zero_amount_past_moneys_places_is_kept_as_plain_zero(spelled: str,
                                                                 kept: str) -> None:
    """Zero is zero whatever its spelling; past money's places it is kept as ``0``, not as a
    thousand decimal places for every column and report to carry (the provider's records,
    read by the same rules, could hand the projector more than ``numeric`` holds)."""
    read = read_general(body(event="payment.failed", code=91051, amount=Decimal(spelled),
                             transactionId="-1"), EAT)
    assert (read.event_type, read.facts["amount"]) == ("payment.failed", kept)
