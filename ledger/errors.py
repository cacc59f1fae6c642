"""Errors of the ledger; driver errors are translated here and never leak inward.

    LedgerError
    ├── LedgerUnavailable   the database could not take or answer the request
    └── LedgerIntegrityError  the database refused a write as a violation of the ledger's rules
"""

from __future__ import annotations


class LedgerError(Exception):
    """The ledger could not do what was asked."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or self.__doc__)


class LedgerUnavailable(LedgerError):
    """The database could not take or answer the request; nothing was committed."""


class LedgerIntegrityError(LedgerError):
    """The database refused a write that would break the ledger's rules."""
