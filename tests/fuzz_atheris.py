"""Coverage-guided fuzzing (atheris, libFuzzer) of both signature header parsers and both
body normalisers. Any exception but each one's own refusal type is a crash.

    python tests/fuzz_atheris.py -runs=50000 [-max_len=2048] CORPUS_DIR
    python tests/fuzz_atheris.py --write-seeds CORPUS_DIR

``tests/test_fuzz_atheris.py`` runs it in CI; on its own it takes libFuzzer's flags.
"""

from __future__ import annotations

import hmac
import json
import sys
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import atheris

with atheris.instrument_imports():
    from ingest import chat_signature, general_signature
    from ingest.chat_body import DeliveryMeta, read_chat, unstorable_chat
    from ingest.errors import BodyError
    from ingest.general_body import read_general, unstorable_general
    from ingest.json_body import parse_object
    from ingest.unstorable import is_unstorable

EAT = ZoneInfo("Africa/Dar_es_Salaam")
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC).timestamp()
SECRETS = [("current", b"chat-secret"), ("previous", b"old-secret")]
GENERAL_SECRET = b"general-secret"


def one_input(data: bytes) -> None:
    """``data`` = one byte choosing the target, the header up to the first newline, then
    the body: a format seeds can be written in (see :func:`seeds`)."""
    if not data:
        return
    which = data[0] % 4
    header_bytes, _, body = data[1:].partition(b"\n")
    header = header_bytes.decode("utf-8", "replace")
    if which == 0:
        try:
            general_signature.verify(body, header, GENERAL_SECRET)
        except general_signature.GeneralSignatureError:
            pass
    elif which == 1:
        try:
            chat_signature.verify(body, header, SECRETS, now=NOW, tolerance_s=300)
        except chat_signature.ChatSignatureError:
            pass
    else:
        meta = DeliveryMeta("1555000111", header or None, 1, None)
        try:
            try:
                parsed, _ = parse_object(body)
            except BodyError as exc:
                if is_unstorable(exc):  # kept by its raw bytes: must never raise otherwise
                    if which == 2:
                        unstorable_general(body, exc)
                    else:
                        unstorable_chat(body, meta, exc)
                return
            if which == 2:
                read_general(parsed, EAT)
            else:
                read_chat(parsed, meta)
        except BodyError:
            pass


def seeds() -> list[bytes]:
    """Well-formed inputs for each target, for libFuzzer to mutate from."""
    general = json.dumps({
        "timestamp": "20261122083000", "reference": "R-1", "amount": 1500.5, "type": "CHARGE",
        "merchantAccountId": "m", "status": "SUCCESSFUL", "transactionId": "TX",
        "customer": {"firstname": "A", "lastname": "B", "phoneNumber": "2557", "mno": "Op"},
        "event": "invoice.paid", "service": "Invoicing", "message": "ok", "code": 93002,
        "invoice": {"invoiceNo": "R-1", "total": 900, "amountPaid": 900, "amountDue": 0,
                    "currency": "TZS", "dueDate": "2026-12-01",
                    "paidDate": "2026-11-22T05:30:00.000Z"}}).encode()
    chat = json.dumps({
        "type": "message", "wabaId": "w", "phoneNumberId": "1555000111", "contactWaId": "2557",
        "profileName": "A", "message": {"id": "wamid.1", "from": "2557", "timestamp": "1795000000",
                                        "type": "text", "text": {"body": "hello"}}}).encode()
    status = json.dumps({
        "type": "status", "wabaId": "w", "phoneNumberId": "1555000111",
        "status": {"id": "wamid.2", "status": "failed", "timestamp": "1795000000",
                   "recipient_id": "2557"},
        "errors": [{"code": 131047, "title": "window closed"}]}).encode()
    t = str(int(NOW))
    v1 = hmac.digest(SECRETS[0][1], t.encode() + b"." + chat, "sha256").hex()
    return [
        b"\x00sha256=" + hmac.digest(GENERAL_SECRET, general, "sha256").hex().encode()
        + b"\n" + general,
        b"\x01t=" + t.encode() + b",v1=" + v1.encode() + b"\n" + chat,
        b"\x02\n" + general, b"\x03delivery-1\n" + chat, b"\x03\n" + status,
    ]


if __name__ == "__main__":
    if sys.argv[1:2] == ["--write-seeds"]:
        from pathlib import Path

        folder = Path(sys.argv[2])
        folder.mkdir(parents=True, exist_ok=True)
        for i, seed in enumerate(seeds()):
            (folder / f"seed-{i}").write_bytes(seed)
        sys.exit(0)
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
