"""The append-only ledger: every verified delivery, raw bytes included, as an immutable event.

This package imports none of hookledger's other packages; they all depend on it.
"""

from ledger.errors import LedgerError, LedgerUnavailable
from ledger.records import AppendResult, NewEvent, StoredEvent
from ledger.store import LedgerStore

__all__ = [
    "AppendResult",
    "LedgerError",
    "LedgerStore",
    "LedgerUnavailable",
    "NewEvent",
    "StoredEvent",
]
