"""Which request headers are kept with an event: all but credentials, bounded in size."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

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


MASK = "[redacted]"


def _needles(secrets: Sequence[bytes]) -> list[str]:
    return [secret.decode("utf-8", "replace") for secret in secrets if len(secret) >= 4]


def mask_text(text: str, secrets: Sequence[bytes]) -> str:
    """``text`` (a request's path, say) with any of ``secrets`` masked."""
    for needle in _needles(secrets):
        text = text.replace(needle, MASK)
    return text


def masked(headers: Mapping[str, str], secrets: Sequence[bytes]) -> dict[str, str]:
    """Headers to keep with a refusal, with any configured secret masked.

    A misconfigured sender may put the secret itself in a header (``X-Service-Signature:
    <secret>``); a refusal row is readable by users, so the secret must not land there.
    """
    needles = _needles(secrets)
    kept = {}
    for name, value in headers.items():
        for needle in needles:
            value = value.replace(needle, MASK)
        kept[name] = value
    return kept
