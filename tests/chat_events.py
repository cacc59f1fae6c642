"""Chat bodies in the spec's shapes, and chat signing with the standard library only."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

PHONE = "1098765432"
WABA = "waba-1"


def inbound(kind: str = "text", *, message_id: str = "wamid.IN1", phone: str = PHONE,
            timestamp: Any = "1700000000", **message: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"id": message_id, "from": "255712345678", "timestamp": timestamp,
                            "type": kind}
    if kind == "text":
        body["text"] = {"body": "Habari, nina swali"}
    elif kind in ("image", "document", "audio", "video"):
        body[kind] = {"id": f"media-{kind}-1", "mime_type": "application/octet-stream"}
    body.update(message)
    return {"type": "message", "wabaId": WABA, "phoneNumberId": phone,
            "contactWaId": "255712345678", "profileName": "Asha", "message": body}


def status(value: str = "delivered", *, message_id: str = "wamid.OUT1", phone: str = PHONE,
           errors: list[Any] | None = None, timestamp: Any = "1700000100") -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": "status", "wabaId": WABA, "phoneNumberId": phone,
        "status": {"id": message_id, "status": value, "timestamp": timestamp,
                   "recipient_id": "255712345678"},
    }
    if errors is not None:
        body["errors"] = errors
    return body


def encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def chat_header(secret: str, body: bytes, t: int) -> str:
    digest = hmac.new(secret.encode(), str(t).encode() + b"." + body, hashlib.sha256)
    return f"t={t},v1={digest.hexdigest()}"
