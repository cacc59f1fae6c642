"""Mending text jsonb cannot hold: what is mended, what is not, and where a mended string
stops a body from being read (ingest.text_repair)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingest.errors import BodyError
from ingest.json_body import parse_object
from ingest.text_repair import (
    chat_identifying,
    general_identifying,
    mend_escapes,
    repaired_object,
)
from tests.chat_events import inbound, status
from tests.general_events import general_body

UNHOLDABLE = re.compile("[\x00\ud800-\udfff]")

# backslashes, quotes and the letters of an escape around NUL, both surrogate halves and
# a character written as a pair: every way an escape can sit beside another
pieces = st.text(st.sampled_from(["\\", "u", "0", "d", "8", '"', "a", "\x00", "\ud83d",
                                  "\ude00", "\U0001f600", "\u00e9"]), max_size=12)
values = st.recursive(pieces | st.integers() | st.none(),
                      lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(pieces, inner, max_size=3), max_leaves=8)


def mended(value: Any) -> Any:
    """What reading a mended body must give: each unholdable character as U+FFFD."""
    if isinstance(value, str):
        return UNHOLDABLE.sub("\ufffd", value)
    if isinstance(value, list):
        return [mended(item) for item in value]
    if isinstance(value, dict):
        return {mended(key): mended(item) for key, item in value.items()}
    return value


@given(values, st.booleans())
def test_mending_replaces_exactly_what_jsonb_cannot_hold(value: Any, ascii_only: bool) -> None:
    """Every NUL and lone surrogate becomes U+FFFD; a pair, an escaped backslash before
    ``u0000`` and every other character read as they were."""
    try:
        text = json.dumps(value, ensure_ascii=ascii_only)
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate written raw: not a UTF-8 body at all
        return
    # as any JSON reader takes it: two adjacent escapes of a pair's halves are one character
    assert json.loads(mend_escapes(text)) == mended(json.loads(text))


def test_text_without_unholdable_escapes_is_left_as_it_is() -> None:
    text = r'{"a": "\\u0000 \ud83d\ude00 \u00e9 \"", "n": 1.50}'
    assert mend_escapes(text) == text


def read(raw: bytes, identifying: Any) -> Any:
    try:
        parse_object(raw)
    except BodyError as exc:
        return repaired_object(raw, exc, identifying)
    raise AssertionError("the body was storable as it was")


def with_text(body: dict[str, Any], *places: tuple[str, ...]) -> bytes:
    """``body`` with half an emoji appended to the strings at ``places``."""
    body = json.loads(json.dumps(body))
    for place in places:
        node = body
        for key in place[:-1]:
            node = node[key]
        node[place[-1]] = f"{node[place[-1]]}@HALF"
    return json.dumps(body).replace("@HALF", "\\ud83d").encode()


def test_describing_fields_are_mended_and_named() -> None:
    body = general_body("payment.confirmed", 91000, reference="R-1")
    repaired = read(with_text(body, ("customer", "lastname"), ("message",)),
                    general_identifying)
    assert repaired is not None and repaired.fields == ("customer.lastname", "message")
    assert repaired.body["customer"]["lastname"].endswith("\ufffd")
    assert repaired.body["amount"] == body["amount"]


@pytest.mark.parametrize("place", [("reference",), ("transactionId",), ("event",),
                                   ("customer", "phoneNumber"), ("status",)])
def test_a_general_field_that_files_or_keys_it_is_not_mended(place: tuple[str, ...]) -> None:
    body = general_body("payment.confirmed", 91000, reference="R-1")
    body["transactionId"] = "TX-1"
    assert read(with_text(body, ("message",), place), general_identifying) is None


@pytest.mark.parametrize(("base", "place", "mendable"), [
    (inbound(), ("profileName",), True),
    (inbound(), ("message", "text", "body"), True),
    (status("failed", errors=[{"code": 131026, "title": "Undeliverable"}]),
     ("errors", 0, "title"), True),
    (inbound(), ("message", "id"), False),
    (inbound(), ("contactWaId",), False),
    (inbound("image"), ("message", "image", "id"), False),
    (status(), ("status", "id"), False),
    (status(), ("status", "recipient_id"), False),
    (status("failed", errors=[{"code": "131026", "title": "Undeliverable"}]),
     ("errors", 0, "code"), False),
    (dict(status("failed"), status=dict(status("failed")["status"], errors=[
        {"code": "131026", "title": "Undeliverable"}])), ("status", "errors", 0, "code"), False),
    (dict(status("failed"), status=dict(status("failed")["status"], errors=[
        {"code": 131026, "title": "Undeliverable"}])), ("status", "errors", 0, "title"), True),
])
def test_chat_fields_that_describe_are_mended_and_ids_are_not(
        base: dict[str, Any], place: tuple[Any, ...], mendable: bool) -> None:
    repaired = read(with_text(base, place), chat_identifying)
    assert (repaired is not None) == mendable
    if repaired is not None:
        assert repaired.fields == (".".join(map(str, place)),)


def test_a_body_with_another_flaw_beside_its_text_is_not_mended() -> None:
    """A repeated key too: the body stays unstorable, as it was."""
    raw = with_text(inbound(), ("profileName",)).replace(
        b'"type": "message"', b'"type": "message", "type": "message"')
    assert read(raw, chat_identifying) is None


def test_keys_that_mending_makes_equal_are_not_mended() -> None:
    raw = b'{"type": "message", "x\\ud800": 1, "x\\ud801": 2}'
    assert read(raw, chat_identifying) is None
