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
# A secret shorter than this is not masked, here or in logs (hookledger.logs): replacing
# every "ab" would mangle every line. The commands warn at start about a configured one.
MIN_MASKED = 4


def mask_needles(secrets: Sequence[bytes]) -> tuple[str, ...]:
    """The texts :func:`mask_text` and :func:`masked` look for: worked out once by a caller
    that masks on every request."""
    return tuple(secret.decode("utf-8", "replace") for secret in secrets
                 if len(secret) >= MIN_MASKED)


def mask_text(text: str, needles: Sequence[str]) -> str:
    """``text`` (a request's path, say) with any of ``needles`` (:func:`mask_needles`)
    masked."""
    for needle in needles:
        text = text.replace(needle, MASK)
    return text


def masked(headers: Mapping[str, str], secrets: Sequence[bytes]) -> dict[str, str]:
    """Headers to keep with a refusal, with any configured secret masked.

    A misconfigured sender may put the secret itself in a header (``X-Service-Signature:
    <secret>``); a refusal row is readable by users, so the secret must not land there.
    """
    needles = mask_needles(secrets)
    return {name: mask_text(value, needles) for name, value in headers.items()}
