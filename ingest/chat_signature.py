"""Verification of system B (chat) deliveries: ``X-Service-Signature: t=<unix>,v1=<hex>``.

``v1`` is HMAC-SHA256, keyed by the phone number's webhook secret, over the bytes
``t + b"." + raw_body``: the timestamp text exactly as received, a dot, the body exactly as
received (never decoded). Pure: no clock (``now`` is a parameter), no I/O, no framework.
Shares nothing with :mod:`ingest.general_signature` on purpose (the spec says not to).

The header is parsed strictly, and every way it can be wrong has its own reason:

==========================  ========================================================
reason                      when
==========================  ========================================================
``missing_signature``       no header, or only whitespace
``malformed_signature``     an item that is not ``t=...`` or ``v1=...`` (junk, empty
                            items, other schemes such as ``v0``)
``duplicate_timestamp``     ``t`` given more than once
``multiple_v1``             ``v1`` given more than once
``missing_timestamp``       no ``t``
``malformed_timestamp``     ``t`` is not 1-12 ASCII digits
``missing_v1``              no ``v1``
``malformed_v1``            ``v1`` holds a character that is not hex
``wrong_length_v1``         ``v1`` is hex but not 64 digits long
``no_secrets``              nothing to verify with (the caller's error, refused)
``bad_signature``           no secret gives this ``v1``
``stale_timestamp``         authentic, but ``|now - t| > tolerance_s``
``unknown_phone_number``    (used by the endpoint) no secret exists for the number
==========================  ========================================================

Tolerance edge: a delivery is fresh while ``|now - t| <= tolerance_s`` (inclusive), in
both directions, so a sender clock ahead of ours is judged like one behind it. The digest is
checked before the age, so ``stale_timestamp`` only ever describes a genuine (but replayed
or delayed) delivery, which is what an operator needs to tell clock skew from forgery.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass

DIGEST_HEX_LENGTH = 64
MAX_TIMESTAMP_DIGITS = 12  # far beyond year 9999 in seconds; bounds int() on hostile input
_HEX = frozenset("0123456789abcdefABCDEF")
_DIGITS = frozenset("0123456789")
_BLANK = " \t"


class ChatSignatureError(Exception):
    """The chat delivery's signature did not verify; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ChatSignature:
    """A parsed header: the timestamp text as sent, and the digest in lower-case hex."""

    timestamp_text: str
    digest_hex: str

    @property
    def timestamp(self) -> int:
        return int(self.timestamp_text)


def parse_header(header: str | None) -> ChatSignature:
    """Parse ``t=<digits>,v1=<64 hex>`` strictly (items in any order, blanks around them)."""
    if header is None or header.strip(_BLANK) == "":
        raise ChatSignatureError("missing_signature")
    timestamp: str | None = None
    digest: str | None = None
    for item in header.split(","):
        key, sep, value = item.strip(_BLANK).partition("=")
        if not sep:
            raise ChatSignatureError("malformed_signature")
        if key == "t":
            if timestamp is not None:
                raise ChatSignatureError("duplicate_timestamp")
            timestamp = value
        elif key == "v1":
            if digest is not None:
                raise ChatSignatureError("multiple_v1")
            digest = value
        else:
            raise ChatSignatureError("malformed_signature")
    if timestamp is None:
        raise ChatSignatureError("missing_timestamp")
    if not 0 < len(timestamp) <= MAX_TIMESTAMP_DIGITS or not _DIGITS.issuperset(timestamp):
        raise ChatSignatureError("malformed_timestamp")
    if digest is None or digest == "":
        raise ChatSignatureError("missing_v1")
    if not _HEX.issuperset(digest):
        raise ChatSignatureError("malformed_v1")
    if len(digest) != DIGEST_HEX_LENGTH:
        raise ChatSignatureError("wrong_length_v1")
    return ChatSignature(timestamp, digest.lower())


def expected_digest(secret: bytes, timestamp_text: str, body: bytes) -> str:
    """The hex ``v1`` a sender holding ``secret`` puts on ``body`` at ``timestamp_text``."""
    signed = timestamp_text.encode("ascii") + b"." + body
    return hmac.digest(secret, signed, hashlib.sha256).hex()  # one-shot, in C


def verify(body: bytes, header: str | None, secrets: Sequence[tuple[str, bytes]], *,
           now: float, tolerance_s: int) -> str:
    """Return the label of the secret that signed ``body``, or raise ChatSignatureError.

    ``secrets`` are ``(label, secret)`` pairs, current first; every one is tried, each with
    a constant-time comparison. ``now`` is Unix seconds.
    """
    if tolerance_s < 0:
        raise ValueError("tolerance_s must not be negative")
    signature = parse_header(header)
    if not secrets:
        raise ChatSignatureError("no_secrets")
    given = signature.digest_hex.encode("ascii")
    for label, secret in secrets:
        computed = expected_digest(secret, signature.timestamp_text, body).encode("ascii")
        if hmac.compare_digest(computed, given):
            if not abs(now - signature.timestamp) <= tolerance_s:  # NaN fails closed
                raise ChatSignatureError("stale_timestamp")
            return label
    raise ChatSignatureError("bad_signature")
