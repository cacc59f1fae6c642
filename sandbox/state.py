"""What the sandbox provider knows: payment records, media, connected chat numbers.

Thread-safe (the server runs in its own thread while tests and the scenario runner write
to it). Optionally persisted to a JSON file (``--state``) so that a scenario's records can
be served later by ``hookledger sandbox serve``.
"""

from __future__ import annotations

import hashlib
import secrets as secrets_module
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandbox import jsonenc
from sandbox.codes import MEDIA_KINDS

DEFAULT_API_KEY = "sandbox-api-key"
DEFAULT_WABA_ID = "waba-sandbox"
RECORD_HIDDEN_FIELDS = frozenset({"payloadSignature"})


@dataclass
class PhoneNumber:
    """A connected chat number: its webhook URL and its current (and retired) secrets."""

    phone_number_id: str
    secret: str
    waba_id: str = DEFAULT_WABA_ID
    webhook_url: str | None = None
    retired_secrets: list[str] = field(default_factory=list)


def new_secret() -> str:
    return "chatsec_" + secrets_module.token_hex(24)


def media_bytes(media_id: str, size: int = 256) -> bytes:
    """Deterministic bytes for a media id (a SHA-256 chain), the same on every call."""
    out = b""
    block = media_id.encode("utf-8")
    while len(out) < size:
        block = hashlib.sha256(block).digest()
        out += block
    return out[:size]


class SandboxState:
    """The provider side's records. Every public method takes the lock."""

    def __init__(self, *, api_key: str = DEFAULT_API_KEY, path: Path | None = None) -> None:
        self.api_key = api_key
        self._path = path
        self._lock = threading.RLock()
        self._records: dict[str, dict[str, Any]] = {}
        self._media: dict[str, str] = {}
        self._numbers: dict[str, PhoneNumber] = {}

    # -- payment records (GET /api/v1/payment/reference/{reference}) -------------------

    def record_general(self, body: dict[str, Any]) -> None:
        """Make a general body the authoritative record of its reference (last one wins)."""
        data = {k: v for k, v in body.items() if k not in RECORD_HIDDEN_FIELDS}
        self.put_record(str(body["reference"]), data)

    def put_record(self, reference: str, data: dict[str, Any]) -> None:
        with self._lock:
            self._records[reference] = dict(data)
            self._save()

    def record(self, reference: str) -> dict[str, Any] | None:
        with self._lock:
            found = self._records.get(reference)
            return dict(found) if found is not None else None

    def references(self) -> list[str]:
        with self._lock:
            return list(self._records)

    # -- media ------------------------------------------------------------------------

    def issue_media(self, media_id: str, kind: str) -> None:
        if kind not in MEDIA_KINDS:
            raise ValueError(f"unknown media kind {kind!r}")
        with self._lock:
            self._media[media_id] = kind
            self._save()

    def media(self, media_id: str) -> tuple[bytes, str] | None:
        with self._lock:
            kind = self._media.get(media_id)
        if kind is None:
            return None
        return media_bytes(media_id), MEDIA_KINDS[kind]

    # -- chat numbers -----------------------------------------------------------------

    def connect_number(self, phone_number_id: str, *, secret: str | None = None,
                       webhook_url: str | None = None, waba_id: str = DEFAULT_WABA_ID
                       ) -> PhoneNumber:
        """Connect (or return) a number; a new number is issued a secret."""
        with self._lock:
            number = self._numbers.get(phone_number_id)
            if number is None:
                number = PhoneNumber(phone_number_id, secret or new_secret(), waba_id)
                self._numbers[phone_number_id] = number
            elif secret is not None:
                number.secret = secret
            if webhook_url is not None:
                number.webhook_url = webhook_url
            self._save()
            return PhoneNumber(number.phone_number_id, number.secret, number.waba_id,
                               number.webhook_url, list(number.retired_secrets))

    def number(self, phone_number_id: str) -> PhoneNumber | None:
        with self._lock:
            n = self._numbers.get(phone_number_id)
            if n is None:
                return None
            return PhoneNumber(n.phone_number_id, n.secret, n.waba_id, n.webhook_url,
                               list(n.retired_secrets))

    def set_webhook_url(self, phone_number_id: str, url: str) -> PhoneNumber:
        return self.connect_number(phone_number_id, webhook_url=url)

    def rotate(self, phone_number_id: str) -> str:
        """Issue a new secret; later deliveries are signed with it. Returned once."""
        with self._lock:
            self.connect_number(phone_number_id)
            number = self._numbers[phone_number_id]
            number.retired_secrets.append(number.secret)
            number.secret = new_secret()
            self._save()
            return number.secret

    # -- persistence ------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "records": {k: dict(v) for k, v in self._records.items()},
                "media": dict(self._media),
                "numbers": {k: {"secret": n.secret, "waba_id": n.waba_id,
                                "webhook_url": n.webhook_url}
                            for k, n in self._numbers.items()},
            }

    def save_to(self, path: Path) -> None:
        path.write_text(jsonenc.dumps(self.snapshot()), encoding="utf-8")

    def _save(self) -> None:
        if self._path is not None:
            self.save_to(self._path)

    @classmethod
    def load(cls, path: Path, *, api_key: str = DEFAULT_API_KEY) -> SandboxState:
        """State from ``path`` (kept up to date there); an absent file starts empty."""
        state = cls(api_key=api_key)
        if path.exists():
            data = jsonenc.loads(path.read_text(encoding="utf-8"))
            state._records = {k: dict(v) for k, v in data.get("records", {}).items()}
            state._media = dict(data.get("media", {}))
            for key, n in data.get("numbers", {}).items():
                state._numbers[key] = PhoneNumber(key, n["secret"], n.get("waba_id",
                                                  DEFAULT_WABA_ID), n.get("webhook_url"))
        state._path = path
        return state
