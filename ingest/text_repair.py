"""A signed body whose only flaw is text ``jsonb`` cannot hold, read with that text mended.

A NUL character or a lone surrogate (a display name cut in the middle of an emoji by a
sender counting UTF-16 units) in one string made the whole delivery unstorable: kept as its
system's malformed event, filed under no payment and no chat thread. For a chat message
that meant no 24-hour window for the customer who had just written, and nothing else ever
opens it; for a payment, a view without it until reconciliation asked the provider.

When every such string is one that only describes (a name, a message's text, a line for
people), the body is read as usual with each unholdable character replaced by U+FFFD, the
replacement character, and the fields mended are named in ``facts.repaired_fields``. The
raw bytes are kept exactly as sent, so nothing is lost. When one of them files or keys the
delivery (a reference, an id, an event name, an amount's block), mending would invent an
identifier the provider never sent: the body is kept malformed, as before.

Such characters reach a string only as ``\\u`` escapes: strict JSON refuses a raw control
character, and UTF-8 an encoded surrogate. So the mending rewrites escapes in the text,
and the numbers, order and spelling of everything else stay the bytes the provider sent.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Protocol, TypeVar

from ingest.errors import BodyError
from ingest.json_body import parse_object
from ingest.unstorable import lenient_object
from ledger.jsonenc import jsonb_can_hold

# strict reading's reasons for a body whose only flaw is its text
REPAIRABLE_REASONS = frozenset({"nul_character", "invalid_unicode"})
REPLACEMENT = "\\ufffd"

Path = tuple[str | int, ...]
# whether a field, by its place in the body, files or keys the delivery
Identifying = Callable[[Path], bool]

# a backslash and what it escapes: in JSON a backslash stands only inside a string, so
# reading these left to right from the start never takes an escaped backslash for one
_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|.)", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Repaired:
    body: dict[str, Any]
    text: str
    fields: tuple[str, ...]  # dotted places of the mended strings, ``errors.0.title``


def _is_high(unit: int) -> bool:
    return 0xD800 <= unit <= 0xDBFF


def _is_low(unit: int) -> bool:
    return 0xDC00 <= unit <= 0xDFFF


def mend_escapes(text: str) -> str:
    """``text`` with each ``\\u0000`` and each lone surrogate escape written as U+FFFD's.

    A high surrogate escape directly followed by a low one is a pair (one character, as
    JSON readers take it) and stays; either half alone is replaced."""
    pieces: list[str] = []
    last = 0
    matches = list(_ESCAPE.finditer(text))
    i = 0
    while i < len(matches):
        match = matches[i]
        hex_digits = match.group(1)
        if hex_digits is None:
            i += 1
            continue
        unit = int(hex_digits, 16)
        if _is_high(unit) and i + 1 < len(matches):
            following = matches[i + 1]
            if following.start() == match.end() and following.group(1) is not None \
                    and _is_low(int(following.group(1), 16)):
                i += 2  # a pair
                continue
        if unit == 0 or _is_high(unit) or _is_low(unit):
            pieces.append(text[last:match.start()])
            pieces.append(REPLACEMENT)
            last = match.end()
        i += 1
    pieces.append(text[last:])
    return "".join(pieces)


def unholdable_places(value: Any, path: Path = ()) -> list[Path]:
    """Where in ``value`` a string or a key holds what ``jsonb`` cannot."""
    found: list[Path] = []
    if isinstance(value, str):
        if not jsonb_can_hold(value):
            found.append(path)
    elif isinstance(value, dict):
        for key, item in value.items():
            if not jsonb_can_hold(key):
                found.append((*path, key))
            found.extend(unholdable_places(item, (*path, key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found.extend(unholdable_places(item, (*path, index)))
    return found


_UNHOLDABLE = re.compile("[\x00\ud800-\udfff]")


def _dotted(path: Path) -> str:
    """A place as facts can hold it: a mended key is named as mended."""
    return ".".join(_UNHOLDABLE.sub("\ufffd", str(part)) for part in path)


def repaired_object(raw: bytes, error: BodyError,
                    identifying: Identifying) -> Repaired | None:
    """The body read with its unholdable text mended, or None when it must stay
    unstorable: another flaw, or a mended string in a field ``identifying`` names."""
    if error.reason not in REPAIRABLE_REASONS:
        return None
    places = unholdable_places(lenient_object(raw))
    if not places or any(identifying(place) for place in places):
        return None
    try:
        text = raw.decode("utf-8")
        body, mended = parse_object(mend_escapes(text).encode("utf-8"))
    except (BodyError, UnicodeDecodeError):  # a second flaw, or keys that now coincide
        return None
    return Repaired(body, mended, tuple(sorted({_dotted(place) for place in places})))


def general_identifying(path: Path) -> bool:
    """A general body's fields that file, key or value a delivery; names, the message line,
    ``payloadSignature`` (never trusted) and fields the spec does not list only describe."""
    if not path:
        return True
    top = path[0]
    if top == "customer":
        return len(path) < 2 or path[1] not in ("firstname", "lastname")
    return top in GENERAL_KEYED


GENERAL_KEYED = frozenset({"timestamp", "reference", "customerReference", "amount", "type",
                           "merchantAccountId", "status", "transactionId", "event", "service",
                           "code", "invoice"})
CHAT_KEYED = frozenset({"type", "wabaId", "phoneNumberId", "contactWaId"})
CHAT_MESSAGE_KEYED = frozenset({"id", "from", "timestamp", "type"})
CHAT_STATUS_KEYED = frozenset({"id", "status", "timestamp", "recipient_id"})


def chat_identifying(path: Path) -> bool:
    """A chat body's fields that file or key a delivery: the type, the numbers, the
    message's id, sender, time and type and its media's id, a status's own fields and an
    error's code. The customer's name, a text, an error's title only describe."""
    if not path:
        return True
    top = path[0]
    if top in CHAT_KEYED:
        return True
    if top == "message":
        if len(path) < 2 or path[1] in CHAT_MESSAGE_KEYED:
            return True
        return len(path) >= 3 and path[2] == "id"  # a media message's media id
    if top == "status":
        if len(path) >= 2 and path[1] == "errors":  # read as the top level's when that is not
            return _error_identifying(path[2:])
        return len(path) < 2 or path[1] in CHAT_STATUS_KEYED
    if top == "errors":
        return _error_identifying(path[1:])
    return False


def _error_identifying(path: Path) -> bool:
    """Within ``errors``: an error's code (its cause) keys the failure; its title describes."""
    return len(path) < 2 or path[1] == "code"


class Read(Protocol):
    """A general or chat delivery, read: a frozen dataclass with its facts."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def facts(self) -> dict[str, Any]: ...


R = TypeVar("R", bound=Read)


def with_repairs(delivery: R, repaired: Repaired) -> R:
    """``delivery`` with the fields its body's mending touched named in its facts."""
    return replace(delivery,
                   facts={**delivery.facts, "repaired_fields": list(repaired.fields)})
