"""No general secret, API key or admin token in any log line, answer, metric, rejection
or report, whatever refusal path a request takes (the chat side: test_chat_webhook)."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import structlog

from hookledger import logs
from reconcile.report_files import report_for
from reconcile.report_render import FORMATS, render
from tests.general_events import encode, general_body
from tests.live import running_service
from tests.signing import general_header
from tests.test_general_webhook import rows

GENERAL_SECRET = "whsec-general-secret-31337"
ADMIN_TOKEN = "admin-token-that-must-stay-hidden"
API_KEY = "api-key-that-must-stay-hidden"


@pytest.fixture
def json_logs() -> Iterator[None]:
    logs.configure(fmt="json", level="debug", secrets=[], cache=False)  # no masker help
    yield
    structlog.reset_defaults()


def test_every_refusal_path_keeps_the_secrets_out(
        db_url: str, json_logs: None, capsys: pytest.CaptureFixture[str]) -> None:
    raw = encode(general_body("payment.confirmed", 91000, reference="SECRET-1"))
    good = general_header(GENERAL_SECRET, raw)
    texts: list[str] = []
    with running_service(db_url, general_secrets=f"main={GENERAL_SECRET}",
                         admin_token=ADMIN_TOKEN, api_key=API_KEY,
                         max_body_bytes=4096) as base, httpx.Client() as client:
        url = f"{base}/webhooks/general/main"
        cases = [
            (raw, {"x-service-signature": good}),  # accepted
            (raw, {}),  # missing signature
            (raw, {"x-service-signature": GENERAL_SECRET}),  # the secret itself, malformed
            (raw, {"x-service-signature": "sha256=" + GENERAL_SECRET}),
            (raw, {"x-service-signature": general_header(GENERAL_SECRET[:-1], raw)}),
            (b"[]", {"x-service-signature": general_header(GENERAL_SECRET, b"[]")}),
            (b"x" * 10_000, {"x-service-signature": good}),  # too large
            (gzip.compress(raw), {"x-service-signature": good, "content-encoding": "gzip"}),
        ]
        for body, headers in cases:
            texts.append(client.post(url, content=body, headers=headers).text)
        texts.append(client.post(f"{base}/webhooks/general/other", content=raw,
                                 headers={"x-service-signature": good}).text)
        for token in (None, ADMIN_TOKEN[:-1], ADMIN_TOKEN + "x"):
            headers = {"authorization": f"Bearer {token}"} if token else {}
            answer = client.get(f"{base}/api/status", headers=headers)
            assert answer.status_code == 401
            texts.append(answer.text)
        ok = client.get(f"{base}/api/status", headers={"authorization": f"Bearer {ADMIN_TOKEN}"})
        assert ok.status_code == 200
        texts.append(ok.text)
        texts.append(client.get(f"{base}/metrics").text)
        texts.append(client.get(f"{base}/readyz").text)
    report = asyncio.run(report_for(db_url))
    texts += [render(report, fmt) for fmt in FORMATS]
    stored = rows(db_url, "SELECT reason, detail, headers::text, body_prefix "
                          "FROM hookledger.rejected_deliveries")
    assert len(stored) == len(cases)  # every refusal recorded (the accepted one is not)
    texts.append(repr(stored))
    texts.append(repr(rows(db_url, "SELECT headers::text, payload::text, facts::text "
                                   "FROM hookledger.ledger")))
    err = capsys.readouterr().err
    lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert {"delivery.accepted", "delivery.refused"} <= {line["event"] for line in lines}
    texts.append(err)
    for value in (GENERAL_SECRET, ADMIN_TOKEN, API_KEY):
        for text in texts:
            assert value not in text, text[max(0, text.find(value) - 200):][:400]


CHAT_SECRET = "chat-secret-that-must-stay-hidden"


def test_a_secret_sent_where_it_does_not_belong_is_masked_in_every_refusal(
        db_url: str, json_logs: None, capsys: pytest.CaptureFixture[str]) -> None:
    """Each endpoint masked only its own secrets, and only once it had loaded them: the
    API key or admin token in any header, the chat secret sent to the general endpoint or
    to a number not its own, a secret in the URL's path, or any secret in a body too large
    to read, reached rejected_deliveries (and the path the log) in clear."""
    with running_service(db_url, general_secrets=f"main={GENERAL_SECRET}",
                         chat_secrets={"1098765432": CHAT_SECRET},
                         admin_token=ADMIN_TOKEN, api_key=API_KEY,
                         max_body_bytes=4096) as base, httpx.Client() as client:
        sent = 0
        for value in (GENERAL_SECRET, CHAT_SECRET, ADMIN_TOKEN, API_KEY):
            for path in ("general/main", "general/other", "chat/1098765432", "chat/555"):
                for body in (b"{}", b"x" * 10_000):
                    client.post(f"{base}/webhooks/{path}", content=body,
                                headers={"x-service-signature": value, "x-extra": value})
                    sent += 1
            for path in (f"general/{value}", f"chat/{value}"):
                client.post(f"{base}/webhooks/{path}", content=b"{}")
                sent += 1
    stored = rows(db_url, "SELECT endpoint, headers::text FROM hookledger.rejected_deliveries")
    assert len(stored) == sent
    err = capsys.readouterr().err
    for value in (GENERAL_SECRET, CHAT_SECRET, ADMIN_TOKEN, API_KEY):
        for text in (repr(stored), err):
            assert value not in text, text[max(0, text.find(value) - 200):][:400]


DB_PASSWORD = "Sup3r%Secret-db-password"


@pytest.mark.parametrize("command", [["report", "--format", "csv"], ["verify"]])
def test_a_database_password_libpq_cannot_read_is_never_printed(
        db_url: str, tmp_path: Path, command: list[str]) -> None:
    """A ``%`` not written ``%25`` in the URL's password: SQLAlchemy (migrate) read it, but
    libpq refused the URL quoting the password ('invalid percent-encoded token: "..."'),
    in a ProgrammingError traceback from ``report``, and in every line of ``serve``'s log
    (the projector's and the pool's retries). Refused at start naming the variable."""
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(db_url)
    url = (f"postgresql://{params.get('user', 'postgres')}:{DB_PASSWORD}@"
           f"{params.get('host', '127.0.0.1')}:{params.get('port', '5432')}/{params['dbname']}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOOKLEDGER_")}
    # run from a folder of its own (no hookledger.toml), this checkout's code
    env.update(HOOKLEDGER_HOME=str(tmp_path), HOOKLEDGER_DATABASE_URL=url,
               PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    result = subprocess.run([sys.executable, "-m", "hookledger", *command], env=env,
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "HOOKLEDGER_DATABASE_URL" in result.stderr
    assert "Traceback" not in result.stderr
    for piece in (DB_PASSWORD, "Sup3r"):
        assert piece not in result.stdout + result.stderr, result.stderr[-2000:]


@pytest.mark.parametrize("url", [
    "postgresql://app:Sup3r/Secret-pw@db.example:5432/ledger",
    "postgresql://app:12/Secret-pw@db.example/ledger",
])
def test_a_slash_in_the_database_password_is_refused_at_start(
        url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """libpq ends the host part at the first ``/``: a password holding one (generated
    passwords do) made its start the port and the rest the database's name, which a
    connection error then repeats."""
    from click.testing import CliRunner

    from hookledger.cli import main

    for name in [k for k in os.environ if k.startswith("HOOKLEDGER_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOOKLEDGER_DATABASE_URL", url)
    monkeypatch.setenv("HOOKLEDGER_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)  # no hookledger.toml
    result = CliRunner().invoke(main, ["report", "--format", "csv"])
    assert result.exit_code == 2, result.output
    assert "HOOKLEDGER_DATABASE_URL" in result.output and "%2F" in result.output
    for piece in ("Sup3r", "Secret-pw"):
        assert piece not in result.output


@pytest.mark.parametrize("url", [
    "postgresql://app:Sup3r%2FSecret@db.example:5432/ledger",
    "postgresql://app@db.example/ledger?application_name=a/b@c",
    "postgresql:///ledger?host=/var/run/postgresql",
    "postgresql://app@%2Fvar%2Frun%2Fpostgresql/ledger",
])
def test_urls_libpq_reads_as_written_are_taken(url: str) -> None:
    from hookledger.settings import Settings

    assert Settings(database_url=url).database_url == url
