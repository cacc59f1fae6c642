"""Reconciliation's errors, one base class. A docstring is the error's default message.

::

    ReconcileError
    ├── ApiError                 the reference API gave no usable answer
    │   ├── ApiUnavailable       timeouts, 5xx, 429: still failing after every retry
    │   ├── MalformedEnvelope    not the {success, code, message, data} envelope
    │   └── ApiRefused           a 4xx other than 404/429
    │       └── ApiKeyRefused    the API key itself: 401, 403, or an authentication code
    ├── MappingError             ``data`` lacks what the configured mapping names
    └── ExpectationInvalid       an expectation that cannot be registered

Messages never carry the API key or the admin token.
"""

from __future__ import annotations


class ReconcileError(Exception):
    """reconciliation failed"""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class ApiError(ReconcileError):
    """the reference API gave no usable answer"""


class ApiUnavailable(ApiError):
    """the reference API kept failing (timeouts, 5xx or 429) after every retry"""


class MalformedEnvelope(ApiError):
    """the reference API answered without a valid envelope"""


class ApiRefused(ApiError):
    """the reference API refused the request"""


class ApiKeyRefused(ApiRefused):
    """the reference API refused the API key"""


class MappingError(ReconcileError):
    """the provider's record lacks a field the mapping names"""


class ExpectationInvalid(ReconcileError):
    """the expectation is not valid"""
