"""Which request headers are kept with an event: all but credentials, bounded in size."""

from __future__ import annotations

from collections.abc import Iterable

CREDENTIAL_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "cookie", "apitoken", "x-api-key", "api-key"}
)
MAX_HEADERS = 40
MAX_VALUE = 1024


def safe_headers(items: Iterable[tuple[str, str]]) -> dict[str, str]:
    kept: dict[str, str] = {}
    for name, value in items:
        lower = name.lower()
        if lower in CREDENTIAL_HEADERS or len(kept) >= MAX_HEADERS:
            continue
        kept[lower] = value[:MAX_VALUE]
    return kept
