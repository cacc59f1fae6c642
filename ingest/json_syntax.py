"""Whether a text is one JSON object, told without recursion.

Python's JSON reader recurses once per level of nesting, so a body nested a few thousand
levels deep stops it with a ``RecursionError`` before it has seen the rest. Such a body is
kept by its raw bytes when it is a JSON object all the same (:mod:`ingest.unstorable`), so
the rest must still be read: a body that opens like an object and then breaks off, or
carries a second value after it, is not one, and must be refused rather than kept. This
scanner reads the grammar with an explicit stack, to any depth, and builds nothing.

It follows what ``json.loads`` accepts, strictly: no control characters in strings, no
``NaN`` or ``Infinity``, whitespace only of the four kinds JSON names. It takes up to
about 0.8 s for a 1 MB body of one-character values (measured), on the worker's loop; only
a body whose signature has been verified gets here, and the provider sends none so deep.
"""

from __future__ import annotations

import re

from ingest.errors import BodyError

_SPACE = re.compile(r"[ \t\n\r]*")
# possessive (``++``, ``*+``): a plain repeat keeps a backtracking point per character,
# about 115 bytes each, so a long string held 120 MB a megabyte; nothing here needs to
# backtrack, since each branch starts with a different character
_STRING = re.compile(r'"(?:[^"\\\x00-\x1f]++|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*+"')
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
_LITERALS = ("true", "false", "null")

# what the scanner expects next
_VALUE, _FIRST_VALUE, _FIRST_KEY, _KEY, _COLON, _AFTER = range(6)


def _invalid(at: int) -> BodyError:
    return BodyError("invalid_json", f"not JSON at character {at}")


def check_one_object(text: str) -> None:
    """Return when ``text`` is exactly one JSON object; raise ``invalid_json`` when it is
    not JSON, ``not_an_object`` when it is some other JSON value."""
    at = _SPACE.match(text).end()  # type: ignore[union-attr]  # matches the empty string
    if text.startswith(("[", '"', "-", "t", "f", "n"), at) or text[at:at + 1].isdigit():
        _scan(text, at)  # a broken value is invalid JSON before it is a wrong type
        raise BodyError("not_an_object", "the body is not a JSON object")
    _scan(text, at)


def _scan(text: str, at: int) -> None:
    """Read one JSON value from ``at`` to the end of ``text`` (trailing space allowed)."""
    open_brackets: list[str] = []  # "}" or "]": what closes each open container
    expect = _VALUE
    end = len(text)
    while True:
        at = _SPACE.match(text, at).end()  # type: ignore[union-attr]
        if at >= end:
            raise _invalid(at)
        char = text[at]
        if expect in (_FIRST_VALUE, _FIRST_KEY, _AFTER) and open_brackets \
                and char == open_brackets[-1]:
            open_brackets.pop()
            at += 1
            expect = _AFTER
        elif expect == _AFTER:
            if not open_brackets or char != ",":
                raise _invalid(at)
            at += 1
            expect = _KEY if open_brackets[-1] == "}" else _VALUE
        elif expect in (_FIRST_KEY, _KEY):
            at = _token(_STRING, text, at)
            expect = _COLON
        elif expect == _COLON:
            if char != ":":
                raise _invalid(at)
            at += 1
            expect = _VALUE
        elif char in "{[":  # _VALUE or _FIRST_VALUE
            open_brackets.append("}" if char == "{" else "]")
            at += 1
            expect = _FIRST_KEY if char == "{" else _FIRST_VALUE
        else:
            at = _scalar(text, at)
            expect = _AFTER
        if expect == _AFTER and not open_brackets:
            if _SPACE.match(text, at).end() != end:  # type: ignore[union-attr]
                raise _invalid(at)
            return


def _token(pattern: re.Pattern[str], text: str, at: int) -> int:
    found = pattern.match(text, at)
    if found is None:
        raise _invalid(at)
    return found.end()


def _scalar(text: str, at: int) -> int:
    """Where the string, number or literal at ``at`` ends."""
    if text[at] == '"':
        return _token(_STRING, text, at)
    for literal in _LITERALS:
        if text.startswith(literal, at):
            return at + len(literal)
    return _token(_NUMBER, text, at)
