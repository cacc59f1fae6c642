"""Signing for tests, written with the standard library only (not the project's code)."""

from __future__ import annotations

import hashlib
import hmac


def general_header(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
