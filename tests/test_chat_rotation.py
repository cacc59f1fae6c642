"""Chat secret rotation and set-webhook against the real sandbox API and a real hookledger.

No patched HTTP clients: hookledger calls the sandbox over loopback HTTP, deliveries reach
hookledger over HTTP, storage is the test's real PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import stat
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from starlette.requests import Request

from hookledger.cli import main
from ingest import chat_rotation
from ingest.chat_rotation import (
    ChatOps,
    SecretNotStored,
    admin_rotate_secret,
    issued_at_of,
    keep_secret,
    rescue_answer_to_file,
    rescue_to_file,
    rotate_or_rescue,
    store_secret_command,
)
from ingest.chat_secrets import fingerprint
from ledger import LedgerUnavailable
from sandbox.runner import Sandbox, running_sandbox
from tests.chat_events import PHONE, encode, inbound
from tests.chat_live import (
    ADMIN_TOKEN,
    API_KEY,
    cli_env,
    execute,
    json_logs,  # noqa: F401 - fixture
    post_chat,
    rows,
    wait_for,
)
from tests.live import running_service
from tests.peak_memory import peak_bytes

OLD_SECRET = "chat-secret-before-rotation-1"
GRACE_S = 2
HIDE_TABLE = "ALTER TABLE hookledger_private.chat_secrets RENAME TO chat_secrets_away"
SHOW_TABLE = "ALTER TABLE hookledger_private.chat_secrets_away RENAME TO chat_secrets"


@pytest.fixture
def sandbox() -> Iterator[Sandbox]:
    with running_sandbox(api_key=API_KEY) as box:
        box.state.connect_number(PHONE, secret=OLD_SECRET)
        yield box


@pytest.fixture
def service(db_url: str, sandbox: Sandbox, tmp_path: Path) -> Iterator[str]:
    with running_service(db_url, chat_secrets={PHONE: OLD_SECRET}, rotation_grace_s=GRACE_S,
                         api_base_url=sandbox.url, api_key=API_KEY, admin_token=ADMIN_TOKEN,
                         home=tmp_path) as base:
        sandbox.state.set_webhook_url(PHONE, f"{base}/webhooks/chat/{PHONE}")
        yield base


class IssuingOnce:
    """A stand-in for the provider's rotate call, for the order of a rotation's own steps
    (what HTTP does is the sandbox's tests'): it issues ``secret``, once ``after`` is set
    when it is given."""

    def __init__(self, secret: str, *, after: asyncio.Event | None = None) -> None:
        self._secret = secret
        self._after = after

    async def __aenter__(self) -> IssuingOnce:
        return self

    async def __aexit__(self, *_: object) -> None:
        return None

    async def rotate_secret(self, phone_number_id: str) -> str:
        if self._after is not None:
            await self._after.wait()
        return self._secret


def admin_rotate(base: str, phone: str = PHONE, token: str = ADMIN_TOKEN) -> httpx.Response:
    return httpx.post(f"{base}/api/chat/{phone}/rotate-secret",
                      headers={"authorization": f"Bearer {token}"}, timeout=30)


def stored_secrets(db_url: str) -> dict[str, object]:
    return {secret: retired for secret, retired in rows(
        db_url, "SELECT secret, retired_at FROM hookledger_private.chat_secrets "
                "WHERE phone_number_id = %s", PHONE)}


def rotation_events(db_url: str) -> list[tuple[str, str, dict[str, object], str]]:
    return rows(db_url, "SELECT source, stream, payload, payload::text || facts::text "
                        "FROM hookledger.ledger WHERE event_type = 'chat.secret.rotated'")


def invoke(args: list[str], env: dict[str, str], stdin: str | None = None):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(main, args, env=env, input=stdin, catch_exceptions=False)


def printed_command(text: str, *, field: str | None = None) -> list[str]:
    """The ``hookledger chat store-secret`` line in ``text``, split as a shell splits it,
    with ``field`` for its FIELD placeholder: the command an operator would paste."""
    [line] = [line for line in text.splitlines() if line.startswith("hookledger chat ")]
    argv = shlex.split(line)
    assert argv[:3] == ["hookledger", "chat", "store-secret"]
    return [field if arg == "FIELD" and field else arg for arg in argv]


def test_admin_rotation_keeps_the_secret_honours_grace_and_records_no_secret(
        service: str, sandbox: Sandbox, db_url: str) -> None:
    """Stored before the answer; new secret at once, old one only inside the grace period."""
    sandbox.dispatcher.pause()  # a delivery queued before the rotation, signed with the old
    queued = sandbox.queue_chat(PHONE, inbound(message_id="wamid.Q1"), delivery_id="queued-1")
    answer = admin_rotate(service)
    assert answer.status_code == 200, answer.text
    new_secret = sandbox.state.number(PHONE).secret  # type: ignore[union-attr]
    assert new_secret != OLD_SECRET and new_secret not in answer.text
    assert answer.json()["label"] == fingerprint(new_secret)
    assert answer.json()["recorded"] is True
    secrets = stored_secrets(db_url)  # committed before the answer was sent
    assert secrets[new_secret] is None and secrets[OLD_SECRET] is not None

    sandbox.dispatcher.resume()
    sandbox.dispatcher.drain()
    assert queued is not None and queued.secret == OLD_SECRET
    assert queued.answers[0][1].status == 200  # old secret, inside the grace period
    fresh = sandbox.queue_chat(PHONE, inbound(message_id="wamid.N1"), delivery_id="new-1")
    sandbox.dispatcher.drain()
    assert fresh is not None and fresh.answers[0][1].status == 200  # new secret, at once

    time.sleep(GRACE_S + 1.2)  # past the grace period and the store's one-second cache
    raw = encode(inbound(message_id="wamid.LATE"))
    assert post_chat(service, PHONE, raw, OLD_SECRET, delivery_id="late-old").status_code == 401
    assert post_chat(service, PHONE, raw, new_secret, delivery_id="late-new").status_code == 200

    [(source, stream, payload, text)] = rotation_events(db_url)
    assert (source, stream) == ("admin", f"chat-number:{PHONE}")
    assert payload["label"] == fingerprint(new_secret) and payload["via"] == "admin"
    assert payload["phone_number_id"] == PHONE and payload["rotated_at"]
    assert new_secret not in text and OLD_SECRET not in text


def test_cli_rotation_stores_the_secret_and_the_running_service_takes_it(
        service: str, sandbox: Sandbox, db_url: str, tmp_path: Path) -> None:
    result = invoke(["chat", "rotate-secret", PHONE], cli_env(db_url, sandbox.url,
                                                              str(tmp_path)))
    assert result.exit_code == 0, result.output
    new_secret = sandbox.state.number(PHONE).secret  # type: ignore[union-attr]
    assert fingerprint(new_secret) in result.stdout
    assert new_secret not in result.output and API_KEY not in result.output
    assert stored_secrets(db_url)[new_secret] is None
    raw = encode(inbound(message_id="wamid.CLI"))
    # another process stored it: the service sees it within its one-second cache
    wait_for(lambda: post_chat(service, PHONE, raw, new_secret,
                               delivery_id="cli-new").status_code == 200, timeout_s=5)
    [(source, _, payload, text)] = rotation_events(db_url)
    assert source == "admin" and payload["via"] == "cli" and new_secret not in text


def test_cli_rotation_on_a_database_never_migrated_first_migrates_then_stores_the_secret(
        sandbox: Sandbox, empty_db_url: str, tmp_path: Path) -> None:
    """Before serve or migrate ever ran: the provider was asked for a secret there was no
    table for, so the once-shown secret was only printed, and store-secret failed too."""
    result = invoke(["chat", "rotate-secret", PHONE], cli_env(empty_db_url, sandbox.url,
                                                              str(tmp_path)))
    assert result.exit_code == 0, result.output
    new_secret = sandbox.state.number(PHONE).secret  # type: ignore[union-attr]
    assert stored_secrets(empty_db_url)[new_secret] is None


def test_cli_storing_failure_prints_the_secret_once_and_store_secret_recovers_it(
        sandbox: Sandbox, db_url: str, tmp_path: Path) -> None:
    """A real failure: the secrets table is not there when the answer arrives."""
    env = cli_env(db_url, sandbox.url, str(tmp_path))
    execute(db_url, HIDE_TABLE)
    result = invoke(["chat", "rotate-secret", PHONE], env)
    assert result.exit_code == 3
    new_secret = sandbox.state.number(PHONE).secret  # type: ignore[union-attr]
    assert result.stderr.count(new_secret) == 1 and new_secret not in result.stdout
    assert "WARNING" in result.stderr and "never show it again" in result.stderr
    assert API_KEY not in result.output
    log_lines = [line for line in result.stderr.splitlines() if line.startswith("{")]
    assert any(json.loads(line)["event"] == "chat_secret.not_stored" for line in log_lines)
    assert all(new_secret not in line for line in log_lines)

    execute(db_url, SHOW_TABLE)
    stored = invoke(["chat", "store-secret", PHONE], env, stdin=new_secret + "\n")
    assert stored.exit_code == 0, stored.output
    assert new_secret not in stored.output
    assert stored_secrets(db_url)[new_secret] is None
    [(_, _, payload, _)] = rotation_events(db_url)
    assert payload["via"] == "store-secret"
    assert "rotated" in stored.stdout and "nothing changed" not in stored.stdout
    # run again (an operator unsure it worked): it says so, rather than "rotated"
    again = invoke(["chat", "store-secret", PHONE], env, stdin=new_secret + "\n")
    assert again.exit_code == 0, again.output
    assert "already is the current one; nothing changed" in again.stdout
    assert "rotated" not in again.stdout and new_secret not in again.output


def test_admin_storing_failure_rescues_the_secret_to_a_private_file(
        service: str, sandbox: Sandbox, db_url: str, tmp_path: Path) -> None:
    execute(db_url, HIDE_TABLE)
    answer = admin_rotate(service)
    execute(db_url, SHOW_TABLE)
    assert answer.status_code == 500
    new_secret = sandbox.state.number(PHONE).secret  # type: ignore[union-attr]
    assert new_secret not in answer.text
    body = answer.json()
    assert body["error"] == "secret_not_stored" and body["label"] == fingerprint(new_secret)
    rescued = Path(body["rescued_to"])
    assert rescued.parent == (tmp_path / "rescued-secrets").resolve()
    assert stat.S_IMODE(os.stat(rescued).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(rescued.parent).st_mode) == 0o700
    assert rescued.read_text().strip() == new_secret
    assert body["detail"].endswith("\n" + body["command"])
    assert printed_command(body["command"]) == [
        "hookledger", "chat", "store-secret", PHONE, "--from-file", str(rescued)]

    result = invoke(printed_command(body["command"])[1:],
                    cli_env(db_url, sandbox.url, str(tmp_path)))
    assert result.exit_code == 0, result.output
    raw = encode(inbound(message_id="wamid.RESCUED"))
    wait_for(lambda: post_chat(service, PHONE, raw, new_secret,
                               delivery_id="rescued").status_code == 200, timeout_s=5)


def test_a_rescued_secret_a_later_rotation_replaced_is_not_stored_over_it(
        service: str, sandbox: Sandbox, db_url: str, tmp_path: Path) -> None:
    """The first rotation's secret could not be stored and was rescued; the operator
    rotated again, which worked. Running the first rescue's printed command afterwards
    made the rescued secret current and retired the one the provider signs with."""
    execute(db_url, HIDE_TABLE)
    failed = admin_rotate(service)
    execute(db_url, SHOW_TABLE)
    assert failed.status_code == 500
    # at once: the rescue file names its instant, written before the lock was let go (it
    # named only its second, read as its end, and a rotation within it counted as older)
    assert admin_rotate(service).status_code == 200
    signing = sandbox.state.number(PHONE).secret  # type: ignore[union-attr]
    result = invoke(printed_command(failed.json()["command"])[1:],
                    cli_env(db_url, sandbox.url, str(tmp_path)))
    assert result.exit_code == 1 and "superseded" in result.output, result.output
    assert "a later rotation replaced it" in result.output
    current = [secret for secret, retired in stored_secrets(db_url).items() if retired is None]
    assert current == [signing]


def test_a_rescue_files_name_says_by_when_its_secret_was_issued(tmp_path: Path) -> None:
    at = datetime(2026, 11, 27, 8, 30, 15, 250000, tzinfo=UTC)
    secret_file = rescue_to_file(tmp_path, PHONE, "sha256:0123456789ab", "s", at)
    answer_file = rescue_answer_to_file(tmp_path, PHONE, {"x": "y"}, at)
    for kept in (secret_file, answer_file):
        assert issued_at_of(kept) == at
    # a name of earlier releases, with no fraction: the end of the second it names
    older = tmp_path / f"{PHONE}-20261127T083015Z-0123456789ab.secret"
    assert issued_at_of(older) == datetime(2026, 11, 27, 8, 30, 16, tzinfo=UTC)
    assert issued_at_of(tmp_path / "my-secret.txt") is None


@pytest.mark.parametrize("phone", ["-15550001111", "1555_0002222"])
def test_the_printed_store_secret_command_runs_as_printed_for_any_valid_id(
        phone: str, db_url: str, tmp_path: Path) -> None:
    """Ids may begin with '-', which the CLI would read as an option ('No such option')."""
    kept = tmp_path / "a home" / f"{phone}.secret"
    kept.parent.mkdir()
    kept.write_text("rescued-secret-7f3a\n")
    command = printed_command(store_secret_command(phone, kept))
    result = invoke(command[1:], {"HOOKLEDGER_DATABASE_URL": db_url,
                                  "HOOKLEDGER_HOME": str(tmp_path)})
    assert result.exit_code == 0, result.output
    assert [secret for secret, in rows(
        db_url, "SELECT secret FROM hookledger_private.chat_secrets "
                "WHERE phone_number_id = %s", phone)] == ["rescued-secret-7f3a"]
    # the line printed beside a secret shown on stderr: the operator pastes it on stdin
    pasted = printed_command(store_secret_command(phone, None))
    result = invoke(pasted[1:], {"HOOKLEDGER_DATABASE_URL": db_url,
                                 "HOOKLEDGER_HOME": str(tmp_path)}, stdin="pasted-secret-9c1e\n")
    assert result.exit_code == 0, result.output
    assert sorted(secret for secret, in rows(
        db_url, "SELECT secret FROM hookledger_private.chat_secrets "
                "WHERE phone_number_id = %s", phone)) == ["pasted-secret-9c1e",
                                                         "rescued-secret-7f3a"]


def test_store_secret_from_a_file_that_is_not_text_is_a_message_not_a_traceback(
        tmp_path: Path) -> None:
    """Such a file once stopped the command with a UnicodeDecodeError traceback."""
    binary = tmp_path / "secret.bin"
    binary.write_bytes(b"\xffsecret-bytes\xfe")
    result = CliRunner().invoke(main, ["chat", "store-secret", PHONE, "--from-file",
                                       str(binary)], env={"HOOKLEDGER_HOME": str(tmp_path)})
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)
    assert "cannot read" in result.output and "nothing changed" in result.output
    assert "secret-bytes" not in result.output and "0xff" not in result.output


@pytest.mark.parametrize("stdin_errors", ["surrogateescape", "strict"])
def test_store_secret_typed_in_another_encoding_is_a_message_not_a_traceback(
        db_url: str, tmp_path: Path, stdin_errors: str) -> None:
    """A secret pasted from a terminal in another encoding than the locale's reached Python
    as lone surrogates (a UnicodeEncodeError traceback from its label) or was not decoded
    at all (a UnicodeDecodeError traceback): each named a byte of the secret."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("HOOKLEDGER_")}
    env.update(HOOKLEDGER_DATABASE_URL=db_url, HOOKLEDGER_HOME=str(tmp_path),
               PYTHONIOENCODING=f"utf-8:{stdin_errors}")
    done = subprocess.run([sys.executable, "-m", "hookledger", "chat", "store-secret", PHONE],
                          input=b"secret-\xffbytes\n", env=env, capture_output=True,
                          timeout=60)
    errors = done.stderr.decode(errors="replace")
    assert done.returncode == 1, errors
    assert "Traceback" not in errors, errors
    assert "not UTF-8 text" in errors and "nothing changed" in errors
    assert "secret-" not in errors and "0xff" not in errors and "udcff" not in errors
    assert rows(db_url, "SELECT count(*) FROM hookledger_private.chat_secrets") == [(0,)]


def test_wrong_api_key_is_a_clear_error_without_the_key_or_a_secret(
        sandbox: Sandbox, db_url: str, tmp_path: Path) -> None:
    wrong = "wrong-api-key-d00d5eed"
    env = cli_env(db_url, sandbox.url, str(tmp_path), HOOKLEDGER_API_KEY=wrong)
    result = invoke(["chat", "rotate-secret", PHONE], env)
    assert result.exit_code == 1
    assert "40101" in result.stderr and "rotation failed" in result.stderr
    assert "Traceback" not in result.output
    assert wrong not in result.output and API_KEY not in result.output
    assert OLD_SECRET == sandbox.state.number(PHONE).secret  # type: ignore[union-attr]
    assert rotation_events(db_url) == []


@pytest.mark.parametrize("layout", ["\n", "\r\n", " "])
def test_an_api_key_with_a_line_end_or_spaces_around_it_still_rotates(
        sandbox: Sandbox, db_url: str, tmp_path: Path, layout: str) -> None:
    """A key read from a file keeps its line end (a Kubernetes secret made from a file, an
    env file with CRLF ends): sent as it was, no HTTP client would send the header, and
    every provider call (rotation, media, reconciliation) failed as a "transport error"
    that named nothing to fix. Spaces around it are layout, as around the admin token."""
    env = cli_env(db_url, sandbox.url, str(tmp_path), HOOKLEDGER_API_KEY=API_KEY + layout)
    result = invoke(["chat", "rotate-secret", PHONE], env)
    assert result.exit_code == 0, result.output
    assert "rotated" in result.stdout and API_KEY not in result.output
    assert OLD_SECRET != sandbox.state.number(PHONE).secret  # type: ignore[union-attr]


@pytest.mark.parametrize("key", ["k\u00e9y-with-an-accent", "key\twith-a-tab"])
def test_an_api_key_no_header_can_carry_is_a_configuration_error_never_echoed(
        sandbox: Sandbox, db_url: str, tmp_path: Path, key: str) -> None:
    """A key no HTTP header can hold failed every call (a non-ASCII one stopped serve at
    start with a UnicodeEncodeError naming no variable): refused naming the variable."""
    env = cli_env(db_url, sandbox.url, str(tmp_path), HOOKLEDGER_API_KEY=key)
    result = CliRunner().invoke(main, ["chat", "rotate-secret", PHONE], env=env)
    assert result.exit_code == 2, result.output
    assert "HOOKLEDGER_API_KEY" in result.output and "Traceback" not in result.output
    assert key not in result.output and "with-a" not in result.output
    assert OLD_SECRET == sandbox.state.number(PHONE).secret  # type: ignore[union-attr]


def test_admin_route_needs_the_token_and_refuses_when_the_provider_refuses(
        db_url: str, sandbox: Sandbox, tmp_path: Path) -> None:
    with running_service(db_url, api_base_url=sandbox.url, api_key="not-the-key-5b1e",
                         admin_token=ADMIN_TOKEN, home=tmp_path) as base:
        assert admin_rotate(base, token="nope").status_code == 401
        assert admin_rotate(base, phone="bad id!").status_code == 400
        answer = admin_rotate(base)
    assert answer.status_code == 502 and answer.json()["code"] == 40101
    assert "not-the-key-5b1e" not in answer.text


def test_a_renamed_answer_field_keeps_the_answer_and_store_secret_takes_the_secret_from_it(
        sandbox: Sandbox, db_url: str, tmp_path: Path) -> None:
    """The spec does not name the rotate answer's field. With the wrong guess the provider
    has rotated all the same: the answer (holding the secret, shown once) was thrown away,
    and every new delivery was refused until someone rotated again."""
    home = tmp_path / "hook home"  # the printed command must survive a space in the path
    env = cli_env(db_url, sandbox.url, str(home),
                  HOOKLEDGER_CHAT_ROTATE_SECRET_FIELD="webhookSecret")
    result = invoke(["chat", "rotate-secret", PHONE], env)
    assert result.exit_code == 3, result.output
    new_secret = sandbox.state.number(PHONE).secret  # type: ignore[union-attr]
    assert new_secret != OLD_SECRET and new_secret not in result.output
    assert "data.webhookSecret" in result.stderr
    assert "(fields: phoneNumberId, secret)" in result.stderr
    [kept] = (home / "rescued-secrets").iterdir()
    assert str(kept.resolve()) in result.stderr and kept.name.endswith(".answer.json")
    # the command to run, whole, as a shell would split it
    command = printed_command(result.stderr)
    assert command == ["hookledger", "chat", "store-secret", PHONE, "--from-file",
                       str(kept.resolve()), "--field", "FIELD"]
    assert stat.S_IMODE(os.stat(kept).st_mode) == 0o600
    assert json.loads(kept.read_text()) == {"phoneNumberId": PHONE, "secret": new_secret}
    assert new_secret not in stored_secrets(db_url)

    unnamed = invoke(["chat", "store-secret", PHONE, "--from-file", str(kept)], env)
    assert unnamed.exit_code == 1 and "--field" in unnamed.stderr
    wrong = invoke(["chat", "store-secret", PHONE, "--from-file", str(kept), "--field", "x"],
                   env)
    assert wrong.exit_code == 1 and "(fields: phoneNumberId, secret)" in wrong.stderr
    assert new_secret not in unnamed.output + wrong.output
    assert new_secret not in stored_secrets(db_url)

    # the printed command, pasted with the field named, stores it
    stored = invoke(printed_command(result.stderr, field="secret")[1:], env)
    assert stored.exit_code == 0, stored.output
    assert new_secret not in stored.output
    assert stored_secrets(db_url)[new_secret] is None


def test_admin_rotation_with_a_renamed_answer_field_keeps_the_answer_in_a_private_file(
        sandbox: Sandbox, db_url: str, tmp_path: Path) -> None:
    home = tmp_path / "hook home"
    home.mkdir()
    with running_service(db_url, chat_secrets={PHONE: OLD_SECRET}, rotation_grace_s=GRACE_S,
                         api_base_url=sandbox.url, api_key=API_KEY, admin_token=ADMIN_TOKEN,
                         home=home, chat_rotate_secret_field="webhookSecret") as base:
        sandbox.state.set_webhook_url(PHONE, f"{base}/webhooks/chat/{PHONE}")
        answer = admin_rotate(base)
        new_secret = sandbox.state.number(PHONE).secret  # type: ignore[union-attr]
        assert answer.status_code == 502 and new_secret not in answer.text
        body = answer.json()
        assert body["error"] == "no_secret_in_answer"
        assert body["fields"] == ["phoneNumberId", "secret"]
        kept = Path(body["rescued_to"])
        assert kept.parent == (home / "rescued-secrets").resolve()
        assert stat.S_IMODE(os.stat(kept).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(kept.parent).st_mode) == 0o700
        # the same command the CLI gives, with the file named, in the detail and alone
        assert body["detail"].endswith("\n" + body["command"])
        assert printed_command(body["command"]) == [
            "hookledger", "chat", "store-secret", PHONE, "--from-file", str(kept),
            "--field", "FIELD"]

        result = invoke(printed_command(body["command"], field="secret")[1:],
                        cli_env(db_url, sandbox.url, str(home)))
        assert result.exit_code == 0, result.output
        raw = encode(inbound(message_id="wamid.FROM-ANSWER"))
        wait_for(lambda: post_chat(base, PHONE, raw, new_secret,
                                   delivery_id="from-answer").status_code == 200, timeout_s=5)


def test_a_rotation_answered_in_a_loose_envelope_still_keeps_the_secret(
        sandbox: Sandbox, db_url: str, tmp_path: Path) -> None:
    """The provider rotated and said ``success: true``, but left out ``code`` and sent a
    null ``message``: read strictly, that answer was malformed and thrown away with the
    secret in it, which the provider never shows again, and every delivery signed with it
    was refused."""
    sandbox.faults.set(malformed_count=1, malformed_kind="loose_envelope")
    result = invoke(["chat", "rotate-secret", PHONE], cli_env(db_url, sandbox.url,
                                                              str(tmp_path)))
    assert result.exit_code == 0, result.output
    new_secret = sandbox.state.number(PHONE).secret  # type: ignore[union-attr]
    assert new_secret != OLD_SECRET and new_secret not in result.output
    assert stored_secrets(db_url)[new_secret] is None


def test_a_malformed_envelope_is_a_clear_error(sandbox: Sandbox, db_url: str,
                                               tmp_path: Path) -> None:
    env = cli_env(db_url, sandbox.url, str(tmp_path))
    for kind in ("missing_fields", "non_json"):
        sandbox.faults.set(malformed_count=1, malformed_kind=kind)
        result = invoke(["chat", "set-webhook", PHONE, "https://hooks.example/chat"], env)
        assert result.exit_code == 1, result.output
        assert "set-webhook failed" in result.stderr and "Traceback" not in result.output


def test_set_webhook_changes_the_number_url_at_the_sandbox(
        sandbox: Sandbox, db_url: str, tmp_path: Path) -> None:
    env = cli_env(db_url, sandbox.url, str(tmp_path))
    result = invoke(["chat", "set-webhook", PHONE, "https://hooks.example/webhooks/chat/1"],
                    env)
    # a path naming another number is set all the same (a proxy may rewrite it), but said
    assert result.exit_code == 0, result.output
    assert "Phone number updated" in result.stdout
    assert f"warning: the URL's path does not end in /webhooks/chat/{PHONE}" in result.stderr
    number = sandbox.state.number(PHONE)
    assert number is not None and number.webhook_url == "https://hooks.example/webhooks/chat/1"
    own = f"https://hooks.example/webhooks/chat/{PHONE}"
    result = invoke(["chat", "set-webhook", PHONE, own], env)
    assert result.exit_code == 0, result.output
    assert "warning" not in result.stderr
    assert sandbox.state.number(PHONE).webhook_url == own  # type: ignore[union-attr]
    # the provider's field name is configurable (the spec does not give it)
    env["HOOKLEDGER_CHAT_WEBHOOK_FIELD"] = "url"
    result = invoke(["chat", "set-webhook", PHONE, "http://127.0.0.1:8080/webhooks/chat/1"],
                    env)
    assert result.exit_code == 0, result.output
    assert sandbox.state.number(PHONE).webhook_url.startswith("http://127.0.0.1")  # type: ignore[union-attr]
    # plain http to a public host is refused before any call
    result = invoke(["chat", "set-webhook", PHONE, "http://hooks.example/x"], env)
    assert result.exit_code == 2 and "https" in result.stderr
    assert sandbox.state.number(PHONE).webhook_url.startswith("http://127.0.0.1")  # type: ignore[union-attr]


def test_no_secret_api_key_or_admin_token_in_logs_of_these_paths(
        service: str, sandbox: Sandbox, db_url: str, tmp_path: Path, json_logs: None,  # noqa: F811
        capsys: pytest.CaptureFixture[str]) -> None:
    issued = []
    assert admin_rotate(service).status_code == 200
    issued.append(sandbox.state.number(PHONE).secret)  # type: ignore[union-attr]
    execute(db_url, HIDE_TABLE)
    assert admin_rotate(service).status_code == 500
    issued.append(sandbox.state.number(PHONE).secret)  # type: ignore[union-attr]
    execute(db_url, SHOW_TABLE)
    raw = encode(inbound(message_id="wamid.LOG"))
    post_chat(service, PHONE, raw, issued[0], delivery_id="log-1")
    err = capsys.readouterr().err
    events = {json.loads(line)["event"] for line in err.splitlines() if line.startswith("{")}
    assert {"chat_secret.rotated", "chat_secret.not_stored", "chat_secret.rescued",
            "delivery.accepted"} <= events
    for value in [*issued, OLD_SECRET, API_KEY, ADMIN_TOKEN]:
        assert value not in err, value[:6]


def test_a_caller_who_hangs_up_still_gets_an_unstored_secret_rescued(tmp_path: Path) -> None:
    """The route is shielded against a caller going away; the rescue of a secret that could
    not be stored must happen inside that shield too, or the secret is lost."""
    async def scenario() -> list[Path]:
        issued = asyncio.Event()
        stored = asyncio.Event()

        # the provider answers after the caller hung up
        def api() -> IssuingOnce:
            return IssuingOnce("issued-once-never-again-7", after=issued)

        class Secrets:
            @contextlib.asynccontextmanager
            async def rotation_lock(self, _: str) -> AsyncIterator[None]:
                yield

            async def store_rotated(self, *_: Any, **__: Any) -> Any:
                stored.set()
                raise LedgerUnavailable("the database is away")

        ops = ChatOps(Secrets(), None, tmp_path, api)  # type: ignore[arg-type]
        app = SimpleNamespace(state=SimpleNamespace(chat_ops=ops))
        request = Request({"type": "http", "app": app, "method": "POST", "headers": [],
                           "path_params": {"phone_number_id": PHONE}})
        handler = asyncio.create_task(admin_rotate_secret(request))
        await asyncio.sleep(0.01)
        handler.cancel()  # the caller hangs up while the provider is rotating
        issued.set()
        with contextlib.suppress(asyncio.CancelledError):
            await handler
        await asyncio.wait_for(stored.wait(), 5)
        for _ in range(200):  # the shielded work goes on without the caller
            await asyncio.sleep(0.01)
            if list(tmp_path.glob("rescued-secrets/*")):
                break
        return list(tmp_path.glob("rescued-secrets/*"))

    [rescued] = asyncio.run(scenario())
    assert rescued.read_text().strip() == "issued-once-never-again-7"


def test_a_store_the_database_never_answers_is_rescued_in_bounded_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A database that stops answering sends no error: the store waited for ever, with
    the secret (shown once) only in memory, and the rescue came only after the rotation's
    lock was let go, whose rollback waits on the same database. Now the store is given up
    after ``STORE_WITHIN_S`` and the secret is on the disk before the lock is let go."""
    monkeypatch.setattr(chat_rotation, "STORE_WITHIN_S", 0.2)

    async def scenario() -> list[Path]:
        releasing = asyncio.Event()

        class Secrets:
            @contextlib.asynccontextmanager
            async def rotation_lock(self, _: str) -> AsyncIterator[None]:
                try:
                    yield
                finally:
                    releasing.set()
                    await asyncio.sleep(3600)  # the rollback, on a database that is away

            async def store_rotated(self, *_: Any, **__: Any) -> Any:
                await asyncio.sleep(3600)  # a database that does not answer
                raise AssertionError("not reached")

        def api() -> IssuingOnce:
            return IssuingOnce("issued-once-never-again-9")

        ops = ChatOps(Secrets(), None, tmp_path, api)  # type: ignore[arg-type]
        work = asyncio.create_task(rotate_or_rescue(ops, api, PHONE))  # type: ignore[arg-type]
        await asyncio.wait_for(releasing.wait(), 5)
        kept = list(tmp_path.glob("rescued-secrets/*"))
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work
        return kept

    [rescued] = asyncio.run(scenario())
    assert rescued.read_text().strip() == "issued-once-never-again-9"


def test_a_store_cancelled_midway_still_hands_the_secret_back() -> None:
    """An operator's Ctrl-C while the database hangs on the store (or a shutdown cancelling
    the rotation) is a store that failed: the secret must come back out to be shown or
    rescued, not vanish with the cancellation."""

    async def scenario() -> SecretNotStored:
        storing = asyncio.Event()

        class Secrets:
            async def store_rotated(self, *_: Any, **__: Any) -> Any:
                storing.set()
                await asyncio.sleep(3600)  # a database that does not answer
                raise AssertionError("not reached")

        task = asyncio.create_task(keep_secret(
            Secrets(), None, PHONE, "issued-once-never-again-8", via="cli"))  # type: ignore[arg-type]
        await storing.wait()
        task.cancel()
        with pytest.raises(SecretNotStored) as raised:
            await task
        return raised.value

    error = asyncio.run(scenario())
    assert error.reveal() == "issued-once-never-again-8"
    assert "issued-once-never-again-8" not in str(error)


def test_a_second_rotation_of_a_number_is_refused_while_the_first_is_under_way(
        db_url: str) -> None:
    """Both would get a secret from the provider, which signs with the later; the one
    stored last was current, and the provider's own was retired after the grace, from when
    every delivery of the number was refused. The second is refused before it asks."""
    from psycopg_pool import AsyncConnectionPool

    from ingest.chat_rotation import RotationError, rotate
    from ingest.chat_secrets import ChatSecretStore
    from ledger import LedgerStore

    async def scenario() -> tuple[list[str], str, str]:
        asked: list[str] = []
        answer = asyncio.Event()

        class Api:
            async def rotate_secret(self, phone_number_id: str) -> str:
                asked.append(phone_number_id)
                await answer.wait()  # the provider takes its time over the first
                return f"issued-{len(asked)}-never-again"

        async with AsyncConnectionPool(db_url, min_size=2, max_size=4,
                                       kwargs={"autocommit": True}) as pool:
            secrets = ChatSecretStore(pool, grace_s=600)
            ledger = LedgerStore(pool)
            first = asyncio.create_task(rotate(Api(), secrets, ledger, PHONE, via="cli"))  # type: ignore[arg-type]
            while not asked:
                await asyncio.sleep(0.01)
            with pytest.raises(RotationError) as refused:
                await rotate(Api(), secrets, ledger, PHONE, via="cli")  # type: ignore[arg-type]
            answer.set()
            done = await first
            # once the first is stored, the number can be rotated again
            again = await rotate(Api(), secrets, ledger, PHONE, via="cli")  # type: ignore[arg-type]
            async with pool.connection() as conn:
                cur = await conn.execute(
                    "SELECT label FROM hookledger_private.chat_secrets "
                    "WHERE phone_number_id = %s AND retired_at IS NULL", (PHONE,))
                [(current,)] = await cur.fetchall()
            assert refused.value.reason == "rotation_in_progress"
            assert done.label == fingerprint("issued-1-never-again")
            return asked, again.label, current

    asked, label, current = asyncio.run(scenario())
    assert asked == [PHONE, PHONE]  # the refused one never asked the provider
    assert current == label == fingerprint("issued-2-never-again")


@pytest.mark.parametrize("bounded", [True, False])
def test_a_rotation_lock_cut_off_by_a_network_blip_is_let_go_within_its_bound(
        db_url: str, monkeypatch: pytest.MonkeyPatch, bounded: bool) -> None:
    """A blip while the lock's session sat idle in its transaction (the provider being
    asked) left the server holding the session and the lock until the kernel gave up on
    the socket, and every rotation of the number was refused meanwhile. Bounded, the
    server ends that session; unbounded (what the bound is for), it is still held."""
    from psycopg_pool import AsyncConnectionPool

    from ingest import chat_secrets
    from ingest.chat_secrets import ChatSecretError, ChatSecretStore
    from tests.relay import SocketRelay

    monkeypatch.setattr(chat_secrets, "ROTATION_LOCK_IDLE_S", 1.0 if bounded else 0.0)
    relay = SocketRelay(db_url)

    async def scenario() -> str | None:
        async with AsyncConnectionPool(relay.url, min_size=1, max_size=2,
                                       kwargs={"autocommit": True}) as cut_pool, \
                AsyncConnectionPool(db_url, min_size=1, max_size=2,
                                    kwargs={"autocommit": True}) as pool:
            holding = ChatSecretStore(cut_pool, grace_s=600)
            other = ChatSecretStore(pool, grace_s=600)
            with contextlib.suppress(Exception):
                async with holding.rotation_lock(PHONE):
                    relay.cut_clients()  # the provider is being asked; the network blips
            await asyncio.sleep(2.5)
            try:
                async with other.rotation_lock(PHONE):
                    return None
            except ChatSecretError as exc:
                return exc.reason
            finally:
                async with pool.connection() as conn:  # end the lingering session anyway
                    await conn.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> "
                        "pg_backend_pid() AND state = 'idle in transaction' "
                        "AND datname = current_database()")

    try:
        refused = asyncio.run(scenario())
    finally:
        relay.close()
    assert refused == (None if bounded else "rotation_in_progress")


def test_a_store_interrupted_by_keyboard_interrupt_hands_the_secret_over_first() -> None:
    """A second Ctrl-C raises KeyboardInterrupt, no error to carry the secret out: the
    command ended with the secret in an exception nobody caught, never shown. It is handed
    to ``on_not_stored`` first, and the interrupt goes on."""
    handed: list[SecretNotStored] = []

    class Secrets:
        async def store_rotated(self, *_: Any, **__: Any) -> Any:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        asyncio.run(keep_secret(Secrets(), None, PHONE, "issued-once-never-again-9",  # type: ignore[arg-type]
                                via="cli", on_not_stored=handed.append))
    [error] = handed
    assert error.reveal() == "issued-once-never-again-9"


def test_a_store_that_fails_hands_the_secret_over_once_and_raises_it() -> None:
    handed: list[SecretNotStored] = []

    class Secrets:
        async def store_rotated(self, *_: Any, **__: Any) -> Any:
            raise LedgerUnavailable("the database is away")

    with pytest.raises(SecretNotStored) as raised:
        asyncio.run(keep_secret(Secrets(), None, PHONE, "issued-once-never-again-10",  # type: ignore[arg-type]
                                via="cli", on_not_stored=handed.append))
    assert handed == [raised.value]



def test_a_chat_api_answer_trickled_in_is_given_up_on_at_its_deadline(
        sandbox: Sandbox) -> None:
    """The timeout bounds each wait for a byte: a rotate or set-webhook answer sent a byte
    at a time held the command (and a rotation its number's lock) for as long as the
    provider liked."""
    from ingest.chat_api import ChatApi, ChatApiUnavailable

    sandbox.faults.set(trickle_ms=100)  # an answer of about 120 bytes: 12 s in all

    async def ask() -> None:
        async with ChatApi(sandbox.url, API_KEY, timeout_s=0.5) as api:
            await api.set_webhook(PHONE, f"https://hooks.example/webhooks/chat/{PHONE}")

    started = time.monotonic()
    with pytest.raises(ChatApiUnavailable) as unavailable:
        asyncio.run(ask())
    assert unavailable.value.reason == "timeout"
    assert time.monotonic() - started < 5


def test_a_chat_api_answer_past_its_bound_is_read_no_further(sandbox: Sandbox) -> None:
    """A rotate or set-webhook answer is a few hundred bytes; it was read whole into memory
    (here 600 bytes gzipped twice, 256 MiB once undone)."""

    from ingest.chat_api import ChatApi, ChatApiMalformed
    from sandbox.server import gzip_bomb

    sandbox.faults.set(malformed_count=1, malformed_kind="gzip_bomb")
    gzip_bomb()  # built before the count begins: the sandbox's, not the client's

    async def ask() -> str:
        async with ChatApi(sandbox.url, API_KEY, timeout_s=5) as api:
            return await api.rotate_secret(PHONE)

    with peak_bytes() as peak, pytest.raises(ChatApiMalformed) as malformed:
        asyncio.run(ask())
    assert malformed.value.reason == "too_large"
    assert peak[0] < 8 * 1024 * 1024, peak
    assert asyncio.run(ask()) == sandbox.state.number(PHONE).secret  # type: ignore[union-attr]
