"""The recursion-free reading of a body nested past Python's JSON reader."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.errors import BodyError
from ingest.json_body import parse_object
from ingest.json_syntax import check_one_object

DEEP = 100_000  # far past the interpreter's recursion limit


def _reject_constant(name: str) -> Any:
    raise ValueError(name)


def verdict_of_pythons_reader(text: str) -> str | None:
    """What ``json.loads`` (NaN and Infinity refused, as ingest refuses them) says."""
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except ValueError:
        return "invalid_json"
    return None if isinstance(value, dict) else "not_an_object"


def verdict_of_scanner(text: str) -> str | None:
    try:
        check_one_object(text)
    except BodyError as exc:
        return exc.reason
    return None


@pytest.mark.parametrize(("raw", "reason"), [
    # broken off in the middle, or with something after the object: not JSON at all
    (b'{"a":' + b"[" * DEEP, "invalid_json"),
    (b'{"a":' + b"[" * DEEP + b"]" * DEEP, "invalid_json"),
    (b'{"a":' + b"[" * DEEP + b"]" * DEEP + b"}{}", "invalid_json"),
    (b'{"a":' + b"[" * DEEP + b"]" * DEEP + b"]", "invalid_json"),
    (b'{"a":' + b"[" * DEEP + b"1,]" + b"]" * (DEEP - 1) + b"}", "invalid_json"),
    (b'{"a":' + b"[" * DEEP + b"NaN" + b"]" * DEEP + b"}", "invalid_json"),
    (b'{"a":' + b'{"b":' * DEEP + b"1" + b"}" * DEEP, "invalid_json"),
    # whole, but not an object
    (b"[" * DEEP + b"]" * DEEP, "not_an_object"),
    (b" \n[" + b"{}," * 10 + b"[" * DEEP + b"]" * DEEP + b"]", "not_an_object"),
    # whole objects, only too deep for jsonb: kept by their raw bytes
    (b'{"a":' + b"[" * DEEP + b"]" * DEEP + b"}", "too_deep"),
    (b' {"a":' + b'{"b":' * DEEP + b'"x"' + b"}" * DEEP + b"}\r\n", "too_deep"),
    (b'{"a": 1, "a": ' + b"[" * DEEP + b"]" * DEEP + b"}", "too_deep"),
])
def test_a_body_nested_past_the_reader_is_read_to_its_end(raw: bytes, reason: str) -> None:
    with pytest.raises(BodyError) as err:
        parse_object(raw)
    assert err.value.reason == reason


def test_a_repeated_key_before_a_deep_broken_off_value_is_not_kept() -> None:
    """The repeated key is found first, mid-parse; the body still has to be one object."""
    raw = b'{"a": 1, "a": ' + b"[" * DEEP
    with pytest.raises(BodyError) as err:
        parse_object(raw)
    assert err.value.reason == "invalid_json"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=6)
    | st.decimals(allow_nan=False, allow_infinity=False),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=4), children, max_size=3),
    max_leaves=12)


def _dumped(value: Any) -> str:
    return json.dumps(value, default=str, ensure_ascii=False)


# single characters that JSON's grammar turns on, and some it refuses
grammar = st.sampled_from([*'{}[]:," \\\t\n0-1.eE+tfnu', "NaN", "\x01", "\u00e9", "x"])


@given(value=json_values, cut=st.integers(min_value=0), insert=st.lists(grammar, max_size=3),
       where=st.integers(min_value=0), dropped=st.integers(min_value=1, max_value=3))
def test_the_scanner_agrees_with_pythons_reader(
        value: Any, cut: int, insert: list[str], where: int, dropped: int) -> None:
    """On anything Python's reader can read without running out of depth: whole values,
    values broken off anywhere, and values with characters put in or taken out anywhere."""
    text = _dumped(value)
    broken = text[:cut % (len(text) + 1)]
    spot = where % (len(text) + 1)
    mangled = text[:spot] + "".join(insert) + text[spot:]
    holed = text[:spot] + text[spot + dropped:]
    for candidate in (text, broken, mangled, holed, f" {text}\n", text + text):
        assert verdict_of_scanner(candidate) == verdict_of_pythons_reader(candidate), candidate


@given(text=st.text(max_size=30))
def test_the_scanner_agrees_on_arbitrary_text(text: str) -> None:
    assert verdict_of_scanner(text) == verdict_of_pythons_reader(text)



def test_the_scanner_agrees_on_every_short_sequence_of_json_punctuation() -> None:
    """Every sequence of up to five of these tokens (37,449 texts): each turn of the
    grammar, taken and mistaken."""
    tokens = ["{", "}", "[", "]", ":", ",", '"k"', "0"]
    for length in range(6):
        for sequence in itertools.product(tokens, repeat=length):
            text = "".join(sequence)
            assert verdict_of_scanner(text) == verdict_of_pythons_reader(text), text


TOKENS = ["{", "}", "[", "]", ":", ",", '"k"', '"\\u00e9"', '"\\u00e"', '"\\x"', '"\x1f"',
          '"\x7f"', "0", "-1.5e+3", "01", "1.", "-", "true", "nul", " ", "\t", "\f"]


@settings(max_examples=500)
@given(tokens=st.lists(st.sampled_from(TOKENS), max_size=10))
def test_the_scanner_agrees_on_token_sequences(tokens: list[str]) -> None:
    """Sequences of JSON's tokens and near misses: strings, numbers, literals, spaces."""
    text = "".join(tokens)
    assert verdict_of_scanner(text) == verdict_of_pythons_reader(text), text
