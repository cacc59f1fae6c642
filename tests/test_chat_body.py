"""Reading verified chat bodies: event types, codes, facts, streams, keys, and refusals."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingest.chat_body import (
    PLATFORM_ERROR_CAUSES,
    DeliveryMeta,
    attempt_of,
    delivery_id_of,
    delivery_id_unusable,
    read_chat,
    read_chat_or_malformed,
    unstorable_chat,
)
from ingest.errors import BodyError
from ingest.json_body import parse_object
from tests.chat_events import PHONE, encode, inbound, status

META = DeliveryMeta(phone_number_id=PHONE, delivery_id="dlv-1", attempt=2,
                    user_agent="service-chat-webhook/1.0")


def read(body: dict[str, Any], meta: DeliveryMeta = META, **kwargs: Any) -> Any:
    parsed, _ = parse_object(encode(body))  # through the strict parser, as the endpoint does
    return read_chat(parsed, meta, **kwargs)


def refused(body: dict[str, Any]) -> str:
    with pytest.raises(BodyError) as caught:
        read(body)
    return caught.value.reason


def test_an_inbound_text_message_is_received_with_its_facts() -> None:
    delivery = read(inbound("text"))
    assert delivery.event_type == "chat.message.received"
    assert delivery.stream == "chat-message:wamid.IN1"
    assert delivery.dedupe_key == "chat:delivery:dlv-1"
    assert delivery.occurred_at == datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)
    facts = delivery.facts
    assert facts["recognised"] is True and facts["direction"] == "inbound"
    assert facts["code"] == 95003 and facts["status"] == "received"
    assert facts["body"] == "Habari, nina swali" and facts["media_id"] is None
    assert facts["message_type"] == "text" and facts["message_type_known"] is True
    assert (facts["phone_number_id"], facts["contact_wa_id"], facts["profile_name"]) == (
        PHONE, "255712345678", "Asha")
    assert facts["waba_id"] == "waba-1"
    assert (facts["attempt"], facts["user_agent"]) == (2, "service-chat-webhook/1.0")
    assert facts["occurred_at"] == "2023-11-14T22:13:20+00:00"


@pytest.mark.parametrize("kind", ["image", "document", "audio", "video"])
def test_each_media_kind_carries_its_media_id(kind: str) -> None:
    delivery = read(inbound(kind))
    assert delivery.event_type == "chat.message.received"
    assert delivery.facts["media_id"] == f"media-{kind}-1"
    assert delivery.facts["message_type"] == kind and delivery.facts["body"] is None


@pytest.mark.parametrize("kind", ["image", "document", "video"])
def test_a_media_messages_caption_is_its_body(kind: str) -> None:
    """What the customer wrote under a photo or a file ("the receipt for order 123") is
    what the message says: it was left out, and chat_messages showed no body at all."""
    delivery = read(inbound(kind, **{kind: {"id": f"media-{kind}-1",
                                            "caption": "Risiti ya oda 123"}}))
    assert (delivery.facts["body"], delivery.facts["media_id"]) == (
        "Risiti ya oda 123", f"media-{kind}-1")
    assert "unread_fields" not in delivery.facts


def test_a_caption_of_an_unexpected_shape_costs_only_the_caption() -> None:
    delivery = read(inbound("image", image={"id": "media-1", "caption": {"text": "x"}}))
    assert delivery.event_type == "chat.message.received"
    assert (delivery.facts["body"], delivery.facts["media_id"]) == (None, "media-1")
    assert delivery.facts["unread_fields"] == ["message.image.caption"]


def test_an_inbound_kind_the_spec_does_not_show_is_still_received_flagged() -> None:
    """It opens the 24-hour window, so it is an inbound message, marked as unknown kind."""
    delivery = read(inbound("location", location={"latitude": 1, "longitude": 2}))
    assert delivery.event_type == "chat.message.received"
    assert delivery.facts["message_type_known"] is False and delivery.facts["media_id"] is None
    sticker = read(inbound("sticker", sticker={"id": "media-st-1"}))
    assert sticker.facts["media_id"] == "media-st-1"


@pytest.mark.parametrize(("value", "event_type", "code"), [
    ("sent", "chat.message.sent", 95000),
    ("delivered", "chat.message.delivered", 95001),
    ("read", "chat.message.read", 95002),
    ("failed", "chat.message.failed", 95050),
])
def test_each_status_has_its_event_and_code(value: str, event_type: str, code: int) -> None:
    delivery = read(status(value))
    assert delivery.event_type == event_type
    assert delivery.stream == "chat-message:wamid.OUT1"
    facts = delivery.facts
    assert facts["code"] == code and facts["status"] == value
    assert facts["direction"] == "outbound" and facts["contact_wa_id"] == "255712345678"
    assert delivery.occurred_at == datetime(2023, 11, 14, 22, 15, tzinfo=UTC)


@pytest.mark.parametrize(("error_code", "code"), [
    (131026, 95057), ("131026", 95057), (130429, 95058), (131031, 95059), (131047, 95063),
    (131050, 95064), (132015, 95065), (131042, 95066),
    (999999, 95050), ("not-a-known-code", 95050),
])
def test_a_failed_status_maps_the_platform_error_or_falls_back_to_95050(
        error_code: Any, code: int) -> None:
    delivery = read(status("failed", errors=[{"code": error_code, "title": "Some title"}]))
    assert delivery.event_type == "chat.message.failed"
    assert delivery.facts["code"] == code
    assert delivery.facts["error_code"] == str(error_code)
    assert delivery.facts["error_title"] == "Some title"


def test_the_error_mapping_is_configurable() -> None:
    delivery = read(status("failed", errors=[{"code": 7, "title": "t"}]),
                    error_causes={**PLATFORM_ERROR_CAUSES, "7": 95064})
    assert delivery.facts["code"] == 95064


def test_errors_inside_the_status_object_are_read_when_the_top_level_has_none() -> None:
    """The platform's own status object carries its errors inside it; a body forwarded
    as-is then has none at the top level, and the cause must not be lost to 95050."""
    body = status("failed")
    body["status"]["errors"] = [{"code": 131047, "title": "Re-engagement message"}]
    facts = read(body).facts
    assert (facts["code"], facts["error_code"], facts["error_title"]) == (
        95063, "131047", "Re-engagement message")


def test_top_level_errors_win_over_the_status_objects() -> None:
    body = status("failed", errors=[{"code": 131026, "title": "Undeliverable"}])
    body["status"]["errors"] = [{"code": 131047, "title": "Re-engagement message"}]
    assert read(body).facts["code"] == 95057


@pytest.mark.parametrize("inner", [{"code": 1}, ["boom"], [{"code": 1.5}], "x"])
def test_a_misshapen_errors_list_inside_status_costs_only_the_detail(inner: Any) -> None:
    body = status("failed")
    body["status"]["errors"] = inner
    delivery = read(body)
    assert delivery.event_type == "chat.message.failed"
    assert (delivery.facts["code"], delivery.facts["error_code"]) == (95050, None)


def test_a_failed_status_without_errors_is_95050() -> None:
    assert read(status("failed")).facts["code"] == 95050
    assert read(status("failed", errors=[])).facts["code"] == 95050


@pytest.mark.parametrize("body", [
    {"type": "reaction", "phoneNumberId": PHONE, "reaction": {"emoji": "x"}},
    {"phoneNumberId": PHONE, "message": {"id": "m"}},
    {"type": 7},
    {"test": True},
    status("deleted"),
])
def test_unknown_types_and_status_values_are_kept_as_unrecognised(body: dict[str, Any]) -> None:
    delivery = read(body)
    assert delivery.event_type == "chat.unrecognised"
    assert delivery.facts["recognised"] is False
    assert delivery.dedupe_key == "chat:delivery:dlv-1"


def test_an_unrecognised_status_is_filed_under_its_message() -> None:
    delivery = read(status("deleted", message_id="wamid.X"))
    assert delivery.stream == "chat-message:wamid.X"
    assert delivery.facts["status"] == "deleted"


@pytest.mark.parametrize(("body", "reason"), [
    ({**inbound(), "message": "text"}, "invalid_field"),
    ({"type": "message", "phoneNumberId": PHONE}, "missing_field"),
    (inbound(message_id=None), "missing_field"),  # type: ignore[arg-type]
    (inbound(message_id=""), "invalid_field"),
    (inbound(id=42), "invalid_field"),
    (inbound(type=None), "missing_field"),
    (inbound(timestamp=1700000000), "invalid_field"),
    (inbound(timestamp="17e8"), "invalid_field"),
    (inbound(timestamp="-1"), "invalid_field"),
    # the customer's id keys the thread (its 24-hour window): strict, as are the ids
    ({**inbound(), "contactWaId": 255712345678}, "invalid_field"),
    (inbound(**{"from": 255712345678}), "invalid_field"),
    ({**status(), "status": "delivered"}, "invalid_field"),
    ({"type": "status", "phoneNumberId": PHONE}, "missing_field"),
    (status(message_id=7), "invalid_field"),  # type: ignore[arg-type]
    (status(timestamp=1700000100), "invalid_field"),
    ({**status(), "status": {"id": "m", "status": 3}}, "invalid_field"),
])
def test_a_known_type_with_wrong_field_types_is_kept_as_malformed(
        body: dict[str, Any], reason: str) -> None:
    assert refused(body) == reason
    kept = read_chat_or_malformed(body, META)
    assert kept.event_type == "chat.malformed" and kept.occurred_at is None
    assert kept.dedupe_key == "chat:delivery:dlv-1"  # retries of it are one event
    assert (kept.facts["reason"], kept.facts["malformed"]) == (reason, True)
    assert kept.facts["recognised"] is False and kept.facts["subject"] == "chat"
    message_id = kept.facts["message_id"]
    assert kept.stream == (f"chat-message:{message_id}" if message_id
                           else f"chat-malformed:{PHONE}")


@pytest.mark.parametrize(("body", "unread", "text", "media_id"), [
    (inbound(text={"body": 5}), ["message.text.body"], None, None),
    (inbound(text="hello"), ["message.text"], None, None),
    (inbound("image", image={"id": 5}), ["message.image.id"], None, None),
    (inbound("image", image="media-1"), ["message.image"], None, None),
    (inbound(text={"body": "habari"}), [], "habari", None),
])
def test_what_an_inbound_message_says_never_costs_the_message(
        body: dict[str, Any], unread: list[str], text: str | None, media_id: str | None
        ) -> None:
    """Its text or media id in a shape not expected made the message malformed: no thread,
    no 24-hour window, although the customer had written. Left out and named instead."""
    read_message = read_chat(body, META)
    assert read_message.event_type == "chat.message.received"
    assert read_message.facts.get("unread_fields", []) == unread
    assert (read_message.facts["body"], read_message.facts["media_id"]) == (text, media_id)


@pytest.mark.parametrize(("errors", "code", "error_code", "title"), [
    ({"code": 1}, 95050, None, None),
    (["boom"], 95050, None, None),
    ([{"code": 1.5, "title": "t"}], 95050, None, None),
    ([{"code": True, "title": "t"}], 95050, None, None),
    ([{"code": 131047, "title": 2}], 95063, "131047", None),
    ([{"code": Decimal("131047.0"), "title": "Re-engagement message"}], 95063, "131047",
     "Re-engagement message"),
    ([{"code": "95063", "title": "window closed"}], 95063, "95063", "window closed"),
    ([{"code": 95066}], 95066, "95066", None),
    ([{"code": 95003}], 95050, "95003", None),  # not a failure cause
])
def test_a_failures_explanation_never_costs_the_failure(
        errors: Any, code: int, error_code: str | None, title: str | None) -> None:
    """A ``failed`` status whose ``errors`` came in a shape not expected was kept as
    malformed, never projected: the message stayed ``sent`` although ``failed`` is
    terminal. The explanation is read leniently; the failure always counts."""
    read = read_chat(status("failed", errors=errors), META)
    assert read.event_type == "chat.message.failed" and read.facts["status"] == "failed"
    assert (read.facts["code"], read.facts["error_code"], read.facts["error_title"]) == (
        code, error_code, title)


@pytest.mark.parametrize(("name", "read_as", "unread"), [
    (["A"], None, ["profileName"]), ({"a": 1}, None, ["profileName"]),
    (True, None, ["profileName"]), ("x" * 513, None, ["profileName"]),
    (4471, "4471", []), ("Asha", "Asha", []), (None, None, [])])
def test_a_profile_name_never_costs_the_inbound_message(name: Any, read_as: str | None,
                                                        unread: list[str]) -> None:
    """Kept as malformed, an inbound message with a numeric display name opened no
    24-hour window and started no thread. One that cannot be read is named, as any
    other field that only describes."""
    read = read_chat({**inbound(), "profileName": name}, META)
    assert read.event_type == "chat.message.received"
    assert read.facts["profile_name"] == read_as
    assert read.facts.get("unread_fields", []) == unread


@pytest.mark.parametrize(("value", "read_as", "unread"), [
    (2001234567, "2001234567", False),
    (Decimal("2001234567"), "2001234567", False),
    ("waba-1", "waba-1", False),
    ({"id": "waba-1"}, None, True),
    (["waba-1"], None, True),
    (False, None, True),
    ("w" * 513, None, True),
])
@pytest.mark.parametrize("base", ["inbound", "failed"])
def test_the_business_account_id_never_costs_the_delivery(
        base: str, value: Any, read_as: str | None, unread: bool) -> None:
    """``wabaId`` only says which business account it is; no fold reads it. Strict, a
    numeric one made an inbound message malformed (no 24-hour window) and a ``failed``
    status too (the message stayed ``sent``). Now read as its text, or left out and named."""
    body = {**(inbound() if base == "inbound" else status("failed")), "wabaId": value}
    read = read_chat(body, META)
    assert read.event_type == ("chat.message.received" if base == "inbound"
                               else "chat.message.failed")
    assert read.facts["waba_id"] == read_as
    assert read.facts.get("unread_fields", []) == (["wabaId"] if unread else [])


@pytest.mark.parametrize(("value", "read_as", "unread"), [
    (255712345678, "255712345678", False),
    (Decimal("255712345678"), "255712345678", False),
    ("255712345678", "255712345678", False),
    ({"wa_id": "255712345678"}, None, True),
    ([255712345678], None, True),
    (True, None, True),
    (None, None, False),
])
@pytest.mark.parametrize("value_of_status", ["sent", "delivered", "read", "failed"])
def test_a_recipient_id_never_costs_the_status(
        value_of_status: str, value: Any, read_as: str | None, unread: bool) -> None:
    """``status.recipient_id`` only describes the message (its ``contact_wa_id``); a status
    opens no thread. Strict, a ``failed`` status with a numeric one was kept malformed,
    never folded, and the message stayed ``sent`` although ``failed`` is terminal."""
    body = status(value_of_status, errors=[{"code": 131047, "title": "Re-engagement"}])
    body["status"]["recipient_id"] = value
    kept = read_chat(body, META)
    assert kept.event_type == f"chat.message.{value_of_status}"
    assert kept.facts["contact_wa_id"] == read_as
    assert kept.facts.get("unread_fields", []) == (["status.recipient_id"] if unread else [])
    if value_of_status == "failed":
        assert kept.facts["code"] == 95063


def test_every_unreadable_descriptive_field_is_named_and_the_message_still_read() -> None:
    body = {**inbound(text={"body": 5}), "wabaId": {"x": 1}, "profileName": ["A"]}
    read = read_chat(body, META)
    assert read.event_type == "chat.message.received"
    assert sorted(read.facts["unread_fields"]) == ["message.text.body", "profileName",
                                                   "wabaId"]


@pytest.mark.parametrize("body", [inbound(phone="555"), status(phone="555"),
                                  {"type": "other", "phoneNumberId": "555"},
                                  {**inbound(), "phoneNumberId": 555}])
def test_a_body_for_another_number_than_the_url_is_a_mismatch(body: dict[str, Any]) -> None:
    assert refused(body) == "phone_number_mismatch"
    with pytest.raises(BodyError):  # meant for another number: refused, never kept
        read_chat_or_malformed(body, META)


def test_without_a_delivery_id_the_key_is_the_canonical_body_hash() -> None:
    meta = DeliveryMeta(phone_number_id=PHONE)
    one = read_chat(parse_object(b'{"type":"status","status":{"id":"m","status":"read"}}')[0],
                    meta)
    same = read_chat(parse_object(
        b'{ "status" : {"status":"read", "id":"m"}, "type":"status" }')[0], meta)
    other = read_chat(parse_object(b'{"type":"status","status":{"id":"m","status":"sent"}}')[0],
                      meta)
    assert one.dedupe_key.startswith("chat:body:")
    assert one.dedupe_key == same.dedupe_key != other.dedupe_key


def test_the_delivery_id_decides_the_key_whatever_the_body() -> None:
    a = read(status("read"), DeliveryMeta(PHONE, delivery_id="d-1"))
    b = read(status("sent"), DeliveryMeta(PHONE, delivery_id="d-1"))
    c = read(status("read"), DeliveryMeta(PHONE, delivery_id="d-2"))
    assert a.dedupe_key == b.dedupe_key == "chat:delivery:d-1" != c.dedupe_key
    assert a.facts["content_sha256"] == c.facts["content_sha256"]


@pytest.mark.parametrize(("raw", "expected"), [
    (None, None), ("", None), ("   ", None), (" evt_1 ", "evt_1"), ("a" * 256, "a" * 256)])
def test_delivery_id_header_values(raw: str | None, expected: str | None) -> None:
    assert delivery_id_of(raw) == expected


@pytest.mark.parametrize("raw", ["a" * 257, "évt", "a\x01b"])
def test_an_unusable_delivery_id_is_absent_and_flagged(raw: str) -> None:
    assert delivery_id_of(raw) is None and delivery_id_unusable(raw)
    kept = read(status("read"), DeliveryMeta(PHONE, delivery_id=delivery_id_of(raw),
                                             delivery_id_unusable=delivery_id_unusable(raw)))
    assert kept.dedupe_key == "chat:body:" + kept.facts["content_sha256"]
    assert kept.facts["delivery_id_unusable"] is True


@pytest.mark.parametrize("raw", [None, "", "  ", "evt_1"])
def test_an_absent_or_usable_delivery_id_is_not_flagged(raw: str | None) -> None:
    assert not delivery_id_unusable(raw)


@pytest.mark.parametrize(("raw", "expected"), [
    (None, None), ("1", 1), (" 5 ", 5), ("x", None), ("-1", None), ("99999", None), ("٣", None)])
def test_attempt_header_values_are_numbers_or_unknown(raw: str | None,
                                                      expected: int | None) -> None:
    assert attempt_of(raw) == expected


def test_the_urls_number_sent_as_a_json_number_is_kept_malformed_not_refused() -> None:
    body = {**inbound(), "phoneNumberId": int(PHONE)}
    assert refused(body) == "invalid_field"
    assert read_chat_or_malformed(body, META).event_type == "chat.malformed"


def test_a_body_jsonb_cannot_hold_is_kept_unless_it_names_another_number() -> None:
    raw = b'{"type": "message", "phoneNumberId": %s, "message": {"id": "w.1", "x": "\\u0000"}}'
    meta = DeliveryMeta(PHONE, delivery_id="d-9")
    try:
        parse_object(raw % PHONE.encode())
    except BodyError as exc:
        kept = unstorable_chat(raw % PHONE.encode(), meta, exc)
    assert (kept.facts["reason"], kept.facts["message_id"]) == ("nul_character", "w.1")
    assert kept.dedupe_key == "chat:delivery:d-9"
    for other in (b"2000000002", b'"2000000002"'):  # as a JSON number or as text
        with pytest.raises(BodyError) as caught:
            unstorable_chat(raw % other, meta, BodyError("nul_character", "a NUL"))
        assert caught.value.reason == "phone_number_mismatch"


@pytest.mark.parametrize(("number", "reason"), [
    (b"1e99999999999999999999", "number_out_of_range"),  # past Decimal's exponent range
    (b"1E-99999999999999999999", "number_out_of_range"),
])
def test_an_exponent_past_decimals_range_is_a_number_out_of_range(number: bytes,
                                                                  reason: str) -> None:
    """Once ``invalid_json``: a signed object refused 400, retried, then dead-lettered."""
    raw = b'{"type": "message", "phoneNumberId": "%s", "message": {"id": "w.2", "n": %s}}' % (
        PHONE.encode(), number)
    with pytest.raises(BodyError) as caught:
        parse_object(raw)
    assert caught.value.reason == reason
    kept = unstorable_chat(raw, DeliveryMeta(PHONE, delivery_id="d-10"), caught.value)
    assert kept.facts["message_id"] == "w.2"


def test_a_repeated_key_beside_such_an_exponent_is_kept_not_raised() -> None:
    """Strict reading stops at the repeated key; the lenient reading that files the body
    met the exponent and raised ``InvalidOperation``, which the endpoint answered 500."""
    raw = (b'{"x": {"k": 1, "k": 2}, "type": "message", "phoneNumberId": "%s", '
           b'"message": {"id": "w.3", "n": 1e99999999999999999999}}' % PHONE.encode())
    with pytest.raises(BodyError) as caught:
        parse_object(raw)
    assert caught.value.reason == "duplicate_json_key"
    kept = unstorable_chat(raw, DeliveryMeta(PHONE, delivery_id="d-11"), caught.value)
    assert (kept.facts["reason"], kept.facts["message_id"]) == ("duplicate_json_key", "w.3")


# -- edges and facts found unpinned by mutation testing ------------------------------------

@pytest.mark.parametrize(("timestamp", "read_as"), [
    ("99999999999", datetime(5138, 11, 16, 9, 46, 39, tzinfo=UTC)),  # eleven digits: read
    ("0", datetime(1970, 1, 1, tzinfo=UTC)),
])
def test_unix_seconds_of_up_to_eleven_digits_are_read(timestamp: str, read_as: datetime) -> None:
    assert read(inbound(timestamp=timestamp)).occurred_at == read_as


@pytest.mark.parametrize("timestamp", ["", "999999999999", "١٧٠٠٠٠٠٠٠٠", "１７００００００００"])
def test_a_timestamp_that_is_not_up_to_eleven_ascii_digits_is_malformed(timestamp: str) -> None:
    """Empty, past what a datetime holds, or digits of another script: a field that cannot
    be read (never a crash of the reader)."""
    assert refused(inbound(timestamp=timestamp)) == "invalid_field"
    assert refused(status(timestamp=timestamp)) == "invalid_field"


@pytest.mark.parametrize("message_id", ["  ", "\t"])
def test_a_blank_id_is_malformed_like_an_empty_one(message_id: str) -> None:
    assert refused(inbound(message_id=message_id)) == "invalid_field"
    assert refused(status(message_id=message_id)) == "invalid_field"


def test_ids_of_up_to_512_characters_are_read_and_longer_are_malformed() -> None:
    assert read(status(message_id="m" * 512)).stream == "chat-message:" + "m" * 512
    assert refused(status(message_id="m" * 513)) == "invalid_field"
    assert refused(inbound(message_id="m" * 513)) == "invalid_field"


def test_the_thread_is_keyed_by_contact_wa_id_else_by_the_sender() -> None:
    """``contactWaId`` names the customer; when absent or empty, ``message.from`` does."""
    named = read({**inbound(), "contactWaId": "255700000001"}).facts
    assert (named["contact_wa_id"], named["from"]) == ("255700000001", "255712345678")
    for body in ({**inbound(), "contactWaId": ""},
                 {k: v for k, v in inbound().items() if k != "contactWaId"}):
        assert read(body).facts["contact_wa_id"] == "255712345678"


def test_texts_up_to_their_limits_are_read_and_past_them_left_out() -> None:
    """A message text up to 64 KiB, a profile name up to 512 characters: read; past them,
    named in ``unread_fields``."""
    long_text = read(inbound(text={"body": "x" * 65536})).facts
    assert long_text["body"] == "x" * 65536 and "unread_fields" not in long_text
    too_long = read(inbound(text={"body": "x" * 65537})).facts
    assert too_long["body"] is None and too_long["unread_fields"] == ["message.text.body"]
    assert read({**inbound(), "profileName": "p" * 512}).facts["profile_name"] == "p" * 512


@pytest.mark.parametrize(("errors", "error_code", "title"), [
    ([{"code": "9" * 64, "title": "t"}], "9" * 64, "t"),
    ([{"code": "9" * 65, "title": "t"}], None, None),   # the whole explanation unread
    ([{"code": "  ", "title": "t"}], None, "t"),         # blank: no code
    ([{"code": 131026, "title": "x" * 65536}], "131026", "x" * 65536),
    ([{"code": 131026, "title": "x" * 65537}], "131026", None),
])
def test_an_error_code_or_title_past_its_limit_is_left_out(
        errors: Any, error_code: str | None, title: str | None) -> None:
    facts = read(status("failed", errors=errors)).facts
    assert (facts["error_code"], facts["error_title"]) == (error_code, title)


def test_misshapen_top_level_errors_give_way_to_the_status_objects() -> None:
    """Top-level ``errors`` that cannot be read are skipped, not taken as no detail."""
    body = status("failed", errors={"code": 1})  # type: ignore[arg-type]
    body["status"]["errors"] = [{"code": 131047, "title": "Re-engagement message"}]
    assert read(body).facts["code"] == 95063


@pytest.mark.parametrize("error_code", ["91051", "92057", "94055", "95003", "95000"])
def test_only_a_listed_chat_failure_code_is_passed_on_as_the_cause(error_code: str) -> None:
    """Another service's failure code (or a chat code that is no failure) says nothing of
    why a chat message failed: 95050."""
    assert read(status("failed", errors=[{"code": error_code}])).facts["code"] == 95050


@pytest.mark.parametrize("value", ["sent", "delivered", "read"])
def test_errors_on_a_status_that_is_not_failed_never_change_its_code(value: str) -> None:
    facts = read(status(value, errors=[{"code": 131047, "title": "t"}])).facts
    assert facts["code"] == {"sent": 95000, "delivered": 95001, "read": 95002}[value]
    assert facts["error_code"] == "131047"


def test_a_phone_number_id_sent_as_a_boolean_is_malformed_not_another_number() -> None:
    body = {**inbound(), "phoneNumberId": True}
    assert refused(body) == "invalid_field"
    assert read_chat_or_malformed(body, META).event_type == "chat.malformed"


def test_the_delivery_facts_carry_the_request_headers() -> None:
    facts = read(inbound()).facts
    assert (facts["delivery_id"], facts["delivery_id_unusable"]) == ("dlv-1", False)
    assert facts["from"] == "255712345678"


def test_an_unrecognised_delivery_is_filed_under_a_findable_message_else_its_number() -> None:
    """An id in ``message`` or ``status`` files it with that message; none usable (blank or
    over-long) files it under the number of the URL."""
    for block in ("message", "status"):
        found = read({"type": "reaction", "phoneNumberId": PHONE, block: {"id": "w.7"}})
        assert (found.stream, found.facts["message_id"]) == ("chat-message:w.7", "w.7")
    for unusable in (" ", "m" * 513, 7):
        kept = read({"type": "reaction", "phoneNumberId": PHONE, "message": {"id": unusable}})
        assert kept.stream == f"chat-unrecognised:{PHONE}" and kept.facts["message_id"] is None


def test_a_malformed_status_is_filed_under_its_message() -> None:
    kept = read_chat_or_malformed(status(timestamp=5), META)
    assert kept.event_type == "chat.malformed" and kept.stream == "chat-message:wamid.OUT1"


def test_a_long_type_is_kept_cut_to_64_characters() -> None:
    """What ``type`` said is kept for a person, bounded: the rest of the body has it all."""
    unknown = read({"type": "t" * 100, "phoneNumberId": PHONE})
    assert unknown.facts["kind"] == "t" * 64
    malformed = read_chat_or_malformed(
        {"type": "message", "phoneNumberId": PHONE, "message": "x"}, META)
    assert malformed.facts["kind"] == "message"
    assert "unstorable" not in malformed.facts
    # the URL's number as a JSON number: malformed whatever the type says
    long_malformed = read_chat_or_malformed({"type": "t" * 100, "phoneNumberId": int(PHONE)},
                                            META)
    assert long_malformed.event_type == "chat.malformed"
    assert long_malformed.facts["kind"] == "t" * 64


def test_an_unstorable_body_is_flagged_so() -> None:
    raw = b'{"type": "message", "phoneNumberId": "%s", "message": {"id": "w.1", "x": "\\u0000"}}'
    kept = unstorable_chat(raw % PHONE.encode(), META, BodyError("nul_character", "a NUL"))
    assert kept.facts["unstorable"] is True and kept.stream == "chat-message:w.1"


@pytest.mark.parametrize(("raw", "expected"), [("1000", 1000), ("9999", 9999), ("10000", None)])
def test_attempt_numbers_of_up_to_four_digits_are_read(raw: str, expected: int | None) -> None:
    assert attempt_of(raw) == expected


def test_a_user_agent_is_kept_up_to_256_characters() -> None:
    from ingest.chat_body import user_agent_of
    assert user_agent_of("u" * 300) == "u" * 256 and user_agent_of(None) is None


def test_the_body_digest_hashes_the_documented_canonical_form() -> None:
    """Written out by hand: keys sorted, numbers as ``{"#n": text}`` in one spelling, a
    boolean as itself (never the number it equals)."""
    import hashlib

    from ingest.chat_body import content_sha256
    body = {"type": "status", "n": Decimal("1000.0"), "ok": True, "list": [2, None, "é"]}
    canonical = '{"list":[{"#n":"2"},null,"é"],"n":{"#n":"1000"},"ok":true,"type":"status"}'
    assert content_sha256(body) == hashlib.sha256(canonical.encode()).hexdigest()
    assert content_sha256({"a": True}) != content_sha256({"a": 1})
    assert content_sha256({"a": 1000}) == content_sha256({"a": Decimal("1E+3")})


@given(st.dictionaries(st.text(max_size=6), st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                 max_size=3),
    max_leaves=8), max_size=5))
def test_the_body_digest_depends_on_content_not_on_key_order(body: dict[str, Any]) -> None:
    from ingest.chat_body import content_sha256
    assert content_sha256(dict(reversed(list(body.items())))) == content_sha256(body)
    assert content_sha256(json.loads(json.dumps(body))) == content_sha256(body)
