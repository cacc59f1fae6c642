"""The provider's two signature schemes, as the sender computes them. Pure.

Written independently of ``ingest/`` on purpose: a bug in hookledger's verifier must not be
hidden by the same bug in the signer. Tests pin these against literal known-answer vectors.

* general (system A): ``X-Service-Signature: sha256=<hex HMAC-SHA256(secret, rawBody)>``
* chat (system B): ``X-Service-Signature: t=<unix>,v1=<hex HMAC-SHA256(secret, t + "." +
  rawBody)>`` plus ``X-Service-Delivery-Id``, ``X-Service-Attempt`` and the fixed
  ``User-Agent``.
"""

from __future__ import annotations

import hashlib
import hmac

SIGNATURE_HEADER = "X-Service-Signature"
DELIVERY_ID_HEADER = "X-Service-Delivery-Id"
ATTEMPT_HEADER = "X-Service-Attempt"
CHAT_USER_AGENT = "service-chat-webhook/1.0"


def _hmac_hex(secret: str | bytes, message: bytes) -> str:
    key = secret.encode("utf-8") if isinstance(secret, str) else secret
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def general_signature(secret: str | bytes, body: bytes) -> str:
    """The general header value for ``body``: ``sha256=<hex>``."""
    return "sha256=" + _hmac_hex(secret, body)


def general_headers(secret: str | bytes, body: bytes) -> dict[str, str]:
    return {"Content-Type": "application/json", SIGNATURE_HEADER: general_signature(secret, body)}


def chat_signature(secret: str | bytes, body: bytes, timestamp: int) -> str:
    """The chat header value: ``t=<unix>,v1=<hex of HMAC over t + "." + body>``."""
    signed = str(timestamp).encode("ascii") + b"." + body
    return f"t={timestamp},v1={_hmac_hex(secret, signed)}"


def chat_headers(secret: str | bytes, body: bytes, *, timestamp: int, delivery_id: str,
                 attempt: int) -> dict[str, str]:
    """Every header of one chat delivery attempt."""
    return {
        "Content-Type": "application/json",
        SIGNATURE_HEADER: chat_signature(secret, body, timestamp),
        DELIVERY_ID_HEADER: delivery_id,
        ATTEMPT_HEADER: str(attempt),
        "User-Agent": CHAT_USER_AGENT,
    }
