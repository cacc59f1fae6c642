"""Fuzzing both body normalisers and the strict JSON reader: whatever a signed sender puts
in a body, the strict reader either gives an object or fails with a BodyError (a 400 with a
reason); an object is then always kept, read or flagged malformed, with facts the ledger can
store (only a chat body naming another number is refused); never any other exception, which
the service would answer with a 500."""

from __future__ import annotations

import json
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ingest import json_body
from ingest.chat_body import DeliveryMeta, read_chat_or_malformed, unstorable_chat
from ingest.codes import GENERAL_EVENTS
from ingest.errors import BodyError
from ingest.general_body import (
    MALFORMED_EVENT_TYPE,
    UNRECOGNISED_EVENT_TYPE,
    read_general_or_malformed,
    unstorable_general,
)
from ingest.json_body import parse_object
from ingest.text_repair import chat_identifying, general_identifying, repaired_object
from ingest.unstorable import is_unstorable
from ledger.jsonenc import dumps
from tests.chat_events import PHONE, inbound, status
from tests.general_events import general_body

EAT = ZoneInfo("Africa/Dar_es_Salaam")
FUZZ = settings(max_examples=300, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])

scalars = (st.none() | st.booleans() | st.integers(min_value=-10**30, max_value=10**30)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20))
json_values = st.recursive(scalars, lambda children: st.lists(children, max_size=3)
                           | st.dictionaries(st.text(max_size=8), children, max_size=3),
                           max_leaves=12)


def storable(facts: dict[str, Any]) -> None:
    """What jsonb holds: UTF-8 text (no lone surrogate) without NUL."""
    text = dumps(facts)
    text.encode("utf-8")
    assert "\x00" not in text and "\\u0000" not in text


def kept_general(raw: bytes) -> None:
    """A JSON object is always kept, with storable facts: read, flagged malformed, read
    with its describing text mended, or (when jsonb cannot hold it) kept by its raw bytes."""
    try:
        parsed, _ = parse_object(raw)
    except BodyError as exc:
        if not is_unstorable(exc):
            return
        if (repaired := repaired_object(raw, exc, general_identifying)) is None:
            kept = unstorable_general(raw, exc)
            assert kept.event_type == MALFORMED_EVENT_TYPE and kept.facts["unstorable"]
            storable(kept.facts)
            return
        parsed = repaired.body
        parse_object(repaired.text.encode("utf-8"))  # jsonb holds the payload now
    read = read_general_or_malformed(parsed, EAT)
    assert read.event_type in {*GENERAL_EVENTS, UNRECOGNISED_EVENT_TYPE, MALFORMED_EVENT_TYPE}
    assert (read.event_type == MALFORMED_EVENT_TYPE) == bool(read.facts.get("malformed"))
    storable(read.facts)


def kept_chat(raw: bytes, meta: DeliveryMeta) -> None:
    try:
        try:
            parsed, _ = parse_object(raw)
        except BodyError as exc:
            if not is_unstorable(exc):
                return
            if (repaired := repaired_object(raw, exc, chat_identifying)) is None:
                storable(unstorable_chat(raw, meta, exc).facts)
                return
            parsed = repaired.body
            parse_object(repaired.text.encode("utf-8"))  # jsonb holds the payload now
        read = read_chat_or_malformed(parsed, meta)
    except BodyError as exc:
        assert exc.reason == "phone_number_mismatch"
        return
    assert read.event_type.startswith("chat.")
    storable(read.facts)


def mutated(base: dict[str, Any], draw_path: list[str], value: Any) -> dict[str, Any]:
    """``base`` with the value at a path (through nested objects) replaced."""
    body = json.loads(json.dumps(base))
    node = body
    for key in draw_path[:-1]:
        if not isinstance(node.get(key), dict):
            break
        node = node[key]
    node[draw_path[-1]] = value
    return body


def general_paths() -> list[list[str]]:
    body = general_body("invoice.paid", 91000, reference="F")
    return [[k] for k in body] + [["invoice", "amountDue"], ["customer", "phoneNumber"]]


def chat_paths() -> list[list[str]]:
    return [[k] for k in inbound()] + [["message", k] for k in inbound()["message"]] + [
        ["status", "status"], ["status", "errors"], ["status", "timestamp"]]


@FUZZ
@given(raw=st.binary(max_size=300))
def test_any_bytes_are_an_object_or_a_body_error(raw: bytes) -> None:
    try:
        value, text = parse_object(raw)
    except BodyError:
        return
    assert isinstance(value, dict) and isinstance(text, str)


@FUZZ
@given(event=st.sampled_from(["payment.confirmed", "payment.failed", "payout.confirmed",
                              "invoice.paid", "invoice.updated", "sms.delivered", "ping"]),
       path=st.sampled_from(general_paths()), value=json_values)
def test_a_general_body_with_any_field_replaced_reads_or_is_refused(
        event: str, path: list[str], value: Any) -> None:
    kept_general(json.dumps(mutated(general_body(event, 91000, reference="F"), path,
                                    value)).encode())


@FUZZ
@given(body=st.dictionaries(st.text(max_size=12), json_values, max_size=8))
def test_any_general_object_reads_or_is_refused(body: dict[str, Any]) -> None:
    kept_general(json.dumps(body).encode())


@FUZZ
@given(base=st.sampled_from(["inbound", "status"]), path=st.sampled_from(chat_paths()),
       value=json_values)
def test_a_chat_body_with_any_field_replaced_reads_or_is_refused(
        base: str, path: list[str], value: Any) -> None:
    body = mutated(inbound() if base == "inbound" else status("failed"), path, value)
    kept_chat(json.dumps(body).encode(), DeliveryMeta(PHONE, "d-1", 1, "ua"))


@FUZZ
@given(body=st.dictionaries(st.text(max_size=12), json_values, max_size=8))
def test_any_chat_object_reads_or_is_refused(body: dict[str, Any]) -> None:
    kept_chat(json.dumps(body).encode(), DeliveryMeta(PHONE, None, None, None))


# JSON values jsonb can hold (NUL and lone surrogates are kept by their raw bytes, above)
holdable_text = st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)),
                        max_size=20)
holdable_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-10**30, max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False) | holdable_text,
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(holdable_text, children, max_size=3), max_leaves=12)
DESCRIPTIVE = {  # (base, path) -> (fact, the name in unread_fields)
    ("inbound", ("wabaId",)): ("waba_id", "wabaId"),
    ("failed", ("wabaId",)): ("waba_id", "wabaId"),
    ("inbound", ("profileName",)): ("profile_name", "profileName"),
    ("failed", ("status", "recipient_id")): ("contact_wa_id", "status.recipient_id"),
}


@FUZZ
@given(where=st.sampled_from(sorted(DESCRIPTIVE)), value=holdable_values)
def test_a_field_that_only_describes_never_costs_the_delivery(
        where: tuple[str, tuple[str, ...]], value: Any) -> None:
    """Whatever JSON type a descriptive chat field comes in, the message is still received
    (its window opens) and the failure still counts: the field is read as text, a number
    as its text, and anything else left out and named in ``unread_fields``."""
    base, path = where
    fact, name = DESCRIPTIVE[where]
    body = mutated(inbound() if base == "inbound" else status("failed"), list(path), value)
    parsed, _ = parse_object(json.dumps(body).encode())  # numbers as the endpoint reads them
    read = read_chat_or_malformed(parsed, DeliveryMeta(PHONE, "d-1", 1, "ua"))
    assert read.event_type == ("chat.message.received" if base == "inbound"
                               else "chat.message.failed")
    readable = value is None or isinstance(value, str) or (
        isinstance(value, int | float) and not isinstance(value, bool))
    assert (name in read.facts.get("unread_fields", [])) is not readable
    if isinstance(value, str):
        assert read.facts[fact] == value
    elif isinstance(value, int) and not isinstance(value, bool):
        assert read.facts[fact] == str(value)
    elif not readable:
        assert read.facts[fact] is None
    storable(read.facts)


# text jsonb cannot hold, in any field: each body is still kept, with storable facts
unholdable = st.text(st.sampled_from(["\x00", "\ud800", "\udfff", "a", "\u00e9", "\U0001f600"]),
                     min_size=1, max_size=6)


@FUZZ
@given(event=st.sampled_from(["payment.confirmed", "payout.failed", "invoice.paid", "ping"]),
       path=st.sampled_from(general_paths()), value=unholdable)
def test_nul_or_lone_surrogates_in_any_general_field_are_kept_storable(
        event: str, path: list[str], value: str) -> None:
    kept_general(json.dumps(mutated(general_body(event, 91000, reference="F"), path,
                                    value)).encode())


@FUZZ
@given(base=st.sampled_from(["inbound", "status"]), path=st.sampled_from(chat_paths()),
       value=unholdable)
def test_nul_or_lone_surrogates_in_any_chat_field_are_kept_storable(
        base: str, path: list[str], value: str) -> None:
    body = mutated(inbound() if base == "inbound" else status("failed"), path, value)
    kept_chat(json.dumps(body).encode(), DeliveryMeta(PHONE, "d-1", 1, "ua"))


def _fully_checked(raw: bytes) -> str | None:
    """What parse_object said before it skipped string checks: every string checked."""
    try:
        value = json_body._DECODER.decode(raw.decode("utf-8"))
    except BodyError as exc:  # the decoder's hooks: duplicate keys, numbers
        return exc.reason
    except (ValueError, RecursionError):
        return "invalid_json"
    if not isinstance(value, dict):
        return "not_an_object"
    try:
        json_body._check(value, 1, texts=True)
    except BodyError as exc:
        return exc.reason
    return None


texts = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=8)


@given(body=st.dictionaries(texts, st.recursive(
    texts | st.integers() | st.none(), lambda inner: st.lists(inner, max_size=3) |
    st.dictionaries(texts, inner, max_size=3), max_leaves=6), max_size=4),
    ascii_only=st.booleans())
def test_string_checks_are_skipped_only_where_none_could_fail(body: dict[str, Any],
                                                              ascii_only: bool) -> None:
    """NUL and lone surrogates (half an emoji) arrive only as \\u escapes, so a body
    without one is refused for them exactly when the full check would refuse it."""
    try:
        raw = json.dumps(body, ensure_ascii=ascii_only).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate written raw is not UTF-8: invalid_utf8
        return
    try:
        parse_object(raw)
        said = None
    except BodyError as exc:
        said = exc.reason
    assert said == _fully_checked(raw)
    event(f"refused: {said}")


@pytest.mark.parametrize("raw", [b'{"a":"\x00"}', b'{"\x00":1}', b'{"a":"\x1f"}',
                                 b'{"a":"\xed\xa0\x80"}', b'{"\xed\xb0\x80":1}'])
def test_a_nul_or_surrogate_without_an_escape_is_refused_all_the_same(raw: bytes) -> None:
    """The cases the skip relies on: raw control characters and encoded surrogates, in
    values and keys, never reach the ledger."""
    with pytest.raises(BodyError) as refused:
        parse_object(raw)
    assert refused.value.reason in ("invalid_json", "invalid_utf8")


@FUZZ
@given(value=json_values, in_array=st.booleans(), unclosed=st.booleans())
def test_a_repeated_key_is_kept_only_in_a_whole_object(value: Any, in_array: bool,
                                                       unclosed: bool) -> None:
    """The decoder meets a repeated key in a nested object before it has read the rest: the
    body is kept by its raw bytes (``duplicate_json_key``) only when the whole of it is one
    JSON object."""
    body = '{"v": ' + json.dumps(value) + ', "o": {"k": 1, "k": 2}}'
    if in_array:
        body = f"[{body}]"
    if unclosed:
        body = body[:-1]
    with pytest.raises(BodyError) as refused:
        parse_object(body.encode())
    expected = ("invalid_json" if unclosed else "not_an_object" if in_array
                else "duplicate_json_key")
    assert refused.value.reason == expected
    assert is_unstorable(refused.value) == (expected == "duplicate_json_key")
