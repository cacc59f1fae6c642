"""Log lines: delivery context bound on every line, and no secret ever written."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx
import psycopg
import pytest
import structlog

from hookledger import logs
from tests.general_events import encode, general_body
from tests.live import running_service
from tests.signing import general_header

if TYPE_CHECKING:
    from hookledger.settings import Settings

SECRET = "whsec-must-never-be-logged-42"


@pytest.fixture
def json_logs(capsys: pytest.CaptureFixture[str]) -> Iterator[None]:
    logs.configure(fmt="json", level="debug", secrets=[SECRET], cache=False)
    yield
    structlog.reset_defaults()


def test_delivery_lines_carry_endpoint_reference_and_event_and_no_secret(
        db_url: str, json_logs: None, capsys: pytest.CaptureFixture[str]) -> None:
    with running_service(db_url, general_secrets=f"main={SECRET}") as base:
        raw = encode(general_body("payment.confirmed", 91000, reference="R-LOG"))
        url = f"{base}/webhooks/general/main"
        httpx.post(url, content=raw, headers={"x-service-signature": general_header(SECRET, raw)})
        httpx.post(url, content=raw, headers={"x-service-signature": "sha256=" + "0" * 64})
        httpx.post(url, content=raw, headers={"x-service-signature": SECRET})
    err = capsys.readouterr().err
    lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    accepted = [line for line in lines if line["event"] == "delivery.accepted"]
    assert accepted and accepted[0]["endpoint"] == "general/main"
    assert accepted[0]["reference"] == "R-LOG" and accepted[0].get("position")
    assert accepted[0]["delivery_event"] == "payment.confirmed"
    refused = [line for line in lines if line["event"] == "delivery.refused"]
    assert {line["reason"] for line in refused} == {"bad_signature", "malformed_signature"}
    assert SECRET not in err


def test_the_masker_hides_a_secret_that_reached_a_log_line() -> None:
    mask = logs.secret_masker([SECRET])
    event = mask(None, "info", {"event": "oops", "detail": f"header was {SECRET}!"})
    assert event["detail"] == f"header was {logs.MASK}!"


def test_the_masker_hides_a_secret_inside_any_value_a_line_renders(
        json_logs: None, capsys: pytest.CaptureFixture[str]) -> None:
    """Only text values were masked: a secret inside a dict, a list, bytes or an exception
    passed as a value was rendered as it was."""
    structlog.get_logger().warning(
        "oops", headers={"x-sig": SECRET, "n": 1}, parts=["a", (SECRET, 2)],
        error=ValueError(f"bad {SECRET}"), raw=SECRET.encode(), count=3, known=None)
    err = capsys.readouterr().err
    assert SECRET not in err
    line = json.loads(err)
    assert line["headers"] == {"x-sig": logs.MASK, "n": 1}
    assert line["parts"] == ["a", [logs.MASK, 2]]
    assert logs.MASK in line["error"] and logs.MASK in line["raw"]
    assert (line["count"], line["known"]) == (3, None)  # the rest as it was


def test_the_masker_keeps_keys_a_renderer_can_write(
        json_logs: None, capsys: pytest.CaptureFixture[str]) -> None:
    """A tuple key became a list, which no dict can hold, and kept a tuple the JSON
    renderer refused it: either way the masker or renderer raised into the code that was
    logging."""
    structlog.get_logger().info("keys", d={("a", "b"): 1, (SECRET, 2): 2, SECRET: 3, 4: 4})
    err = capsys.readouterr().err
    assert SECRET not in err
    assert json.loads(err)["d"] == {"('a', 'b')": 1, str((logs.MASK, 2)): 2, logs.MASK: 3,
                                    "4": 4}


def test_library_records_are_json_lines_and_masked_too(
        capsys: pytest.CaptureFixture[str]) -> None:
    """uvicorn's traceback of a failing request, say, goes through the same masker."""
    root = logging.getLogger()
    level = root.level
    handler = again = logs.route_stdlib(fmt="json", level="warning", secrets=[SECRET])
    try:
        try:
            raise RuntimeError(f"bad header {SECRET}")
        except RuntimeError:
            logging.getLogger("uvicorn.error").exception("Exception in %s", "ASGI application")
        logging.getLogger("psycopg.pool").info("an info line, below the level")
        again = logs.route_stdlib(fmt="json", level="warning", secrets=[SECRET])
        assert [h for h in root.handlers if h in (handler, again)] == [again]  # replaced
    finally:
        root.removeHandler(handler)
        root.removeHandler(again)
        root.setLevel(level)
    err = capsys.readouterr().err
    assert SECRET not in err
    (line,) = [json.loads(text) for text in err.splitlines()]
    assert line["event"] == "Exception in ASGI application"
    assert line["logger"] == "uvicorn.error" and line["level"] == "error"
    assert f"RuntimeError: bad header {logs.MASK}" in line["exception"]


class _Writes:
    """A stderr that keeps each write() call apart."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def test_each_line_is_one_write_so_threads_cannot_split_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Our lines and the libraries' go to one stderr from several threads (the projector's
    beside uvicorn's supervisor); a line written in two calls could take another thread's
    line between its text and its newline."""
    stderr = _Writes()
    monkeypatch.setattr("sys.stderr", stderr)
    logs.configure(fmt="json", level="info", secrets=[], cache=False)
    root = logging.getLogger()
    level = root.level
    handler = logs.route_stdlib(fmt="json", level="warning")
    try:
        structlog.get_logger("t").info("ours", n=1)
        logging.getLogger("uvicorn.error").warning("theirs")
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        structlog.reset_defaults()
    assert [json.loads(call)["event"] for call in stderr.calls] == ["ours", "theirs"]
    assert all(call.endswith("\n") and call.count("\n") == 1 for call in stderr.calls)


def _said_at_start(settings: Settings, capsys: pytest.CaptureFixture[str]
                   ) -> tuple[str, list[dict[str, Any]]]:
    """What a command's logging set-up wrote to standard error: the text, and its JSON lines
    read."""
    from hookledger.cli import configure_logging

    try:
        configure_logging(settings)
    finally:
        structlog.reset_defaults()
    err = capsys.readouterr().err
    return err, [json.loads(line) for line in err.splitlines() if line.startswith("{")]


def test_a_secret_too_short_to_mask_is_named_at_start_and_never_shown(
        capsys: pytest.CaptureFixture[str]) -> None:
    from hookledger.settings import Settings

    settings = Settings(general_secrets="short=xyz,long=a-secret-long-enough",
                        chat_secrets="2557000000=ab", api_key="k9", admin_token="t" * 32,
                        log_format="json")
    err, lines = _said_at_start(settings, capsys)
    warned = [line for line in lines if line["event"] == "secrets.too_short_to_mask"]
    assert len(warned) == 1
    assert warned[0]["where"] == ["HOOKLEDGER_GENERAL_SECRETS short",
                                  "HOOKLEDGER_CHAT_SECRETS 2557000000", "HOOKLEDGER_API_KEY"]
    assert "xyz" not in err and '"k9"' not in err


def test_long_enough_secrets_start_without_a_warning(capsys: pytest.CaptureFixture[str]) -> None:
    from hookledger.settings import Settings

    settings = Settings(general_secrets="main=abcd", api_key="an-api-key", log_format="json")
    err, _ = _said_at_start(settings, capsys)
    assert "secrets.too_short_to_mask" not in err


@pytest.mark.parametrize(("base_url", "warned_of"), [
    ("http://api.example.com", "api.example.com"),
    ("http://10.0.0.7:8090", "10.0.0.7"),
    ("https://api.example.com", None),
    ("http://127.0.0.1:8090", None),
    ("http://localhost:8090", None),
    ("http://[::1]:8090", None),
    ("http://127.0.0.1.nip.io", "127.0.0.1.nip.io"),
])
def test_an_api_key_sent_in_the_clear_is_warned_of_at_start(
        capsys: pytest.CaptureFixture[str], base_url: str, warned_of: str | None) -> None:
    """An ``http://`` reference API on another machine took the API key across the network
    unencrypted in every request, without a word (the chat webhook URL is held to https
    but on loopback)."""
    from hookledger.settings import Settings

    settings = Settings(api_base_url=base_url, api_key="an-api-key-of-some-length",
                        log_format="json")
    err, lines = _said_at_start(settings, capsys)
    warned = [line for line in lines if line["event"] == "settings.api_key_in_the_clear"]
    assert [line["host"] for line in warned] == ([warned_of] if warned_of else [])
    assert "an-api-key-of-some-length" not in err


class _ReaderGone:
    """Standard error whose reader goes away once ``gone`` is set (journald restarted, the
    other end of a pipe closed, the log file's disk full): every write then fails."""

    gone = False

    def write(self, text: str) -> int:
        if self.gone:
            raise BrokenPipeError(32, "Broken pipe")
        return len(text)

    def flush(self) -> None:
        if self.gone:
            raise BrokenPipeError(32, "Broken pipe")

    def isatty(self) -> bool:
        return False


def test_a_log_line_that_cannot_be_written_fails_no_delivery(
        db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each log line raised BrokenPipeError into the request that wrote it: a signed but
    malformed delivery (logged before its append) was answered 500 and never kept, the
    general system never sending it again; a committed one was answered 500 too, and a
    forged one 500, unrecorded."""
    stderr = _ReaderGone()
    monkeypatch.setattr("sys.stderr", stderr)
    logs.configure(fmt="json", level="info", secrets=[SECRET], cache=False)
    try:
        with running_service(db_url, general_secrets=f"main={SECRET}") as base:
            stderr.gone = True
            url = f"{base}/webhooks/general/main"
            answers = []
            for body in (general_body("payment.confirmed", 91000, reference="R-PIPE-1"),
                         general_body("payment.confirmed", 91000, reference="R-PIPE-2",
                                      amount="lots")):
                raw = encode(body)
                answers.append(httpx.post(url, content=raw, headers={
                    "x-service-signature": general_header(SECRET, raw)}).status_code)
            answers.append(httpx.post(url, content=b"{}", headers={
                "x-service-signature": "sha256=" + "0" * 64}).status_code)
    finally:
        structlog.reset_defaults()
    assert answers == [200, 200, 401]
    with psycopg.connect(db_url) as conn:
        kept = conn.execute("SELECT event_type, payload->>'reference' FROM hookledger.ledger "
                            "WHERE source = 'general' ORDER BY position").fetchall()
        refused = conn.execute("SELECT reason FROM hookledger.rejected_deliveries").fetchall()
    assert kept == [("payment.confirmed", "R-PIPE-1"), ("general.malformed", "R-PIPE-2")]
    assert refused == [("bad_signature",)]


# what a sender holding one general secret can put in a reference, which every line of its
# request carries: cursor up and erase (the line before is gone), colour, a next-line
# control and Unicode line breaks (a line that looks the service's own)
CONTROLS = "\x1b[1A\x1b[2K\x1b[31m\x1bE\x0b\x0c\x85\u2028\u2029\x07"
FORGED = "2026-01-01T00:00:00Z\x1b[C[info\x1b[C]\x1b[Cservice.stopped"
SGR = re.compile(r"\x1b\[[0-9;]*m")  # the console renderer's own colours


def test_console_lines_show_a_delivery_s_control_characters_escaped(
        db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """With HOOKLEDGER_LOG_FORMAT=console, text a signed delivery chose reached the terminal
    as it was: escape sequences that erased and forged the service's own lines."""
    logs.configure(fmt="console", level="info", secrets=[SECRET], cache=False)
    reference = "R-TTY" + CONTROLS + FORGED
    try:
        with running_service(db_url, general_secrets=f"main={SECRET}") as base:
            raw = encode(general_body("payment.confirmed", 91000, reference=reference))
            answer = httpx.post(f"{base}/webhooks/general/main", content=raw,
                                headers={"x-service-signature": general_header(SECRET, raw)})
    finally:
        structlog.reset_defaults()
    assert answer.status_code == 200
    err = SGR.sub("", capsys.readouterr().err)
    accepted = [line for line in err.split("\n") if "delivery.accepted" in line]
    assert len(accepted) == 1 and "R-TTY" in accepted[0]
    assert not [c for c in err if not c.isprintable() and c != "\n"]
    assert "\\x1b[1A\\x1b[2K" in accepted[0] and "\\u2028" in accepted[0]


def test_console_tracebacks_keep_their_lines_but_no_control_characters(
        capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure(fmt="console", level="info", secrets=[], cache=False)
    try:
        try:
            raise ValueError("bad reference R-1" + CONTROLS)
        except ValueError:
            structlog.get_logger().exception("request.failed" + CONTROLS)
    finally:
        structlog.reset_defaults()
    err = SGR.sub("", capsys.readouterr().err)
    assert "Traceback (most recent call last):\n" in err
    assert "ValueError: bad reference R-1\\x1b[1A" in err
    assert not [c for c in err if not c.isprintable() and c != "\n"]


def test_console_library_records_show_control_characters_escaped(
        capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    level = root.level
    handler = logs.route_stdlib(fmt="console", level="warning")
    try:
        logging.getLogger("uvicorn.error").warning("Invalid request %s", "/x" + CONTROLS)
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    err = SGR.sub("", capsys.readouterr().err)
    assert err.count("\n") == 1 and "/x\\x1b[1A" in err
    assert not [c for c in err if not c.isprintable() and c != "\n"]
