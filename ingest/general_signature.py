"""Verification of system A (general) deliveries: ``X-Service-Signature: sha256=<hex>``.

HMAC-SHA256 over the exact raw body bytes with the webhook's signing secret, compared in
constant time, before anything is parsed. Pure: no clock, no I/O, no framework. Shares
nothing with the chat scheme on purpose (the spec says not to).
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

_PREFIX = "sha256="
_HEX_LENGTH = 64
_HEX_DIGITS = frozenset("0123456789abcdef")


class GeneralSignatureError(Exception):
    """The delivery's signature did not verify."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class GeneralSignature:
    digest_hex: str


def parse_header(header: str | None) -> GeneralSignature:
    """Parse ``sha256=<64 hex>`` strictly; hex is accepted in either case."""
    if header is None or header.strip() == "":
        raise GeneralSignatureError("missing_signature")
    value = header.strip()
    if not value.startswith(_PREFIX):
        raise GeneralSignatureError("malformed_signature")
    digest = value[len(_PREFIX):].lower()
    if len(digest) != _HEX_LENGTH or not _HEX_DIGITS.issuperset(digest):
        raise GeneralSignatureError("malformed_signature")
    return GeneralSignature(digest)


def verify(body: bytes, header: str | None, secret: bytes) -> None:
    """Raise :class:`GeneralSignatureError` unless ``header`` signs ``body`` with ``secret``."""
    signature = parse_header(header)
    expected = hmac.digest(secret, body, hashlib.sha256).hex()  # one-shot, in C
    if not hmac.compare_digest(expected.encode("ascii"), signature.digest_hex.encode("ascii")):
        raise GeneralSignatureError("bad_signature")
