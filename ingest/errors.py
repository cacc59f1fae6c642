"""Errors of ingest. Each refusal carries a stable ``reason`` recorded with the delivery.

    IngestError
    ├── BodyError           a verified body that cannot be read: HTTP 400 when it is not a
    │                       JSON object (or a chat body for another number); a readable
    │                       object with unreadable fields is kept as ``*.malformed`` instead
    ├── BodyTooLarge        a body over the size limit (HTTP 413)
    └── BodyTooSlow         a body not received in time (HTTP 408)
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
    """The body is larger than the configured limit."""


class BodyTooSlow(IngestError):
    """The body did not arrive within the time allowed (a stalled or hostile client)."""
