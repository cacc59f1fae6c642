"""Errors of ingest. Each refusal carries a stable ``reason`` recorded with the delivery.

    IngestError
    ├── BodyError           a verified body that cannot be read: HTTP 400 when it is not a
    │                       JSON object (or a chat body for another number); a readable
    │                       object with unreadable fields is kept as ``*.malformed`` instead
    ├── BodyTooLarge        a body over the size limit (HTTP 413)
    ├── BodyTooSlow         a body not received in time (HTTP 408)
    └── BodyIncomplete      the client went away before its body ended (recorded; nobody is
                            left to read the 400)
"""

from __future__ import annotations


class IngestError(Exception):
    """A delivery could not be taken."""

    def __init__(self, reason: str, detail: str | None = None) -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class BodyError(IngestError):
    """The body, or one of its fields, cannot be read; the ``reason`` says which."""


class BodyTooLarge(IngestError):
    """The body is larger than the configured limit. Carries its first bytes (``head``)
    and the size known (declared, or read before the limit was passed): the general
    system never sends a delivery again, and those bytes often name its reference."""

    def __init__(self, reason: str, detail: str | None, head: bytes = b"",
                 size: int = 0) -> None:
        super().__init__(reason, detail)
        self.head = head
        self.size = size


class BodyTooSlow(IngestError):
    """The body did not arrive within the time allowed (a stalled or hostile client)."""


class BodyIncomplete(IngestError):
    """The connection closed before the whole body arrived. Recorded with what did arrive:
    the general system never sends a delivery again, so the bytes it cut off (a reference,
    often) are the only trace of a payment to look up."""

    def __init__(self, reason: str, detail: str | None, received: bytes) -> None:
        super().__init__(reason, detail)
        self.received = received
