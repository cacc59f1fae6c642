"""``hookledger chat ...``: rotate a number's secret, set its webhook URL, store a rescued one.

Part of the composition root: reads settings, opens the database, builds the API client.
``hookledger.cli`` is imported inside the commands (it mounts this group at its end).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import NoReturn

import click
from psycopg_pool import AsyncConnectionPool

from hookledger.settings import Settings
from ingest.chat_api import (
    ChatApi,
    ChatApiError,
    SecretFieldMissing,
    webhook_path_warning,
    webhook_url_problem,
)
from ingest.chat_rotation import (
    Rotated,
    RotationError,
    SecretNotStored,
    answer_kept_advice,
    answer_lost_advice,
    issued_at_of,
    keep_secret,
    rescue_answer_to_file,
    rotate,
    store_secret_command,
)
from ingest.chat_secrets import ChatSecretStore, valid_phone_number_id
from ledger import LedgerStore
from ledger.store import ready_to_append

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_SECRET_NOT_STORED = 3


def chat_api_factory(settings: Settings) -> Callable[[], ChatApi] | None:
    """A maker of API clients from settings; None without ``HOOKLEDGER_API_BASE_URL``."""
    if not settings.api_base_url:
        return None
    return partial(ChatApi, settings.api_base_url,
                   settings.api_key.get_secret_value() if settings.api_key else None,
                   rotate_secret_field=settings.chat_rotate_secret_field,
                   webhook_field=settings.chat_webhook_field,
                   timeout_s=settings.chat_api_timeout_s)


def _fail(message: str, code: int = EXIT_FAILED) -> NoReturn:
    click.echo(f"hookledger: {message}", err=True)
    sys.exit(code)


def _settings() -> Settings:
    from hookledger.cli import configure_logging, load_settings

    settings = load_settings()
    configure_logging(settings)
    return settings


def _api(settings: Settings) -> ChatApi:
    factory = chat_api_factory(settings)
    if factory is None:
        _fail("HOOKLEDGER_API_BASE_URL is not set", EXIT_USAGE)
    return factory()


def _check_id(phone_number_id: str) -> None:
    if not valid_phone_number_id(phone_number_id):
        _fail(f"{phone_number_id[:80]!r} is not a valid phone number id", EXIT_USAGE)


async def _open_pool(url: str) -> AsyncConnectionPool:
    """A small pool, checked before the provider is called: a dead database stops us early."""
    pool = AsyncConnectionPool(url, min_size=1, max_size=2, open=False,
                               kwargs={"autocommit": True}, name="hookledger-chat",
                               configure=ready_to_append)
    try:
        await pool.open(wait=True, timeout=15)
    except Exception as exc:  # noqa: BLE001 - reported by type
        await pool.close()
        raise RotationError("database_unavailable",
                            f"database unavailable ({type(exc).__name__}); nothing changed") \
            from None
    return pool


def _report(rotated: Rotated, settings: Settings) -> None:
    if not rotated.changed:  # store-secret of the secret already current
        click.echo(f"{rotated.phone_number_id}: secret {rotated.label} already is the "
                   f"current one; nothing changed")
    else:
        click.echo(f"rotated {rotated.phone_number_id}: new secret {rotated.label} stored; "
                   f"the previous one still verifies for {settings.rotation_grace_s} s")
    if not rotated.recorded:
        click.echo("hookledger: warning: the secret is stored, but the chat.secret.rotated "
                   "ledger event could not be written", err=True)


def _show_secret(exc: SecretNotStored) -> None:
    # the only place the secret is ever shown: once, to the operator, on stderr
    click.echo(
        f"hookledger: WARNING: {exc}.\n"
        "The provider already signs new deliveries with it and will never show it again.\n"
        "Keep it now; once the database works, run "
        f"'{store_secret_command(exc.phone_number_id, None)}' and paste it "
        f"(or set HOOKLEDGER_CHAT_SECRETS={exc.phone_number_id}=<secret> and restart).\n"
        f"NEW SECRET ({exc.label}): {exc.reveal()}", err=True)


def _keep_answer(settings: Settings, phone_number_id: str,
                 exc: SecretFieldMissing) -> Path | OSError:
    """Keep the answer that holds the new secret under a field not looked in; never print
    it (unlike a secret in hand, which field holds it is for the operator to say)."""
    try:
        return rescue_answer_to_file(settings.home, phone_number_id, exc.reveal_data(),
                                     datetime.now(UTC))
    except OSError as io_error:
        return io_error


def _answer_kept(phone_number_id: str, exc: SecretFieldMissing,
                 kept: Path | OSError) -> NoReturn:
    if isinstance(kept, OSError):
        _fail(f"{exc}. Keeping the answer failed too ({type(kept).__name__}). "
              f"{answer_lost_advice()}", EXIT_SECRET_NOT_STORED)
    _fail(f"WARNING: {exc}.\n{answer_kept_advice(phone_number_id, kept)}",
          EXIT_SECRET_NOT_STORED)


def _secret_from_file(from_file: Path, field: str | None) -> str:
    """The secret in ``from_file``: its whole text, or with ``field`` that field of the
    JSON object in it (a kept rotate answer). No message quotes the file's content."""
    try:
        text = from_file.read_text(encoding="utf-8")
    except UnicodeDecodeError:  # not its message: that quotes a byte of the secret
        _fail(f"cannot read {from_file}: not UTF-8 text; nothing changed")
    except OSError as exc:
        _fail(f"cannot read {from_file}: {exc.strerror or type(exc).__name__}; "
              "nothing changed")
    if field is None:
        if text.lstrip().startswith("{"):
            _fail(f"{from_file} holds a provider answer, not a secret: name the field that "
                  "holds the secret with --field; nothing changed")
        return text.strip()
    try:
        answer = json.loads(text)
    except (ValueError, RecursionError):
        _fail(f"{from_file} is not a JSON object, which --field reads; nothing changed")
    value = answer.get(field) if isinstance(answer, dict) else None
    if not isinstance(value, str) or not value.strip():
        fields = ", ".join(sorted(answer))[:200] if isinstance(answer, dict) else ""
        _fail(f"{from_file} has no text in field {field!r} (fields: {fields}); "
              "nothing changed")
    return value.strip()


def _typed_secret() -> str:
    """The secret pasted at the prompt. Bytes a terminal sent in another encoding than the
    locale's are refused by what they are, never quoted: they are the secret's (they
    reached its label as lone surrogates, or were not decoded: a traceback naming one)."""
    try:
        secret = click.prompt("secret", hide_input=True).strip()
        secret.encode("utf-8")
    except (UnicodeDecodeError, UnicodeEncodeError):
        _fail("the secret given is not UTF-8 text; nothing changed")
    return secret


@click.group()
def chat() -> None:
    """Chat numbers through the provider's API: secrets and webhook URLs."""


@chat.command(name="rotate-secret")
@click.argument("phone_number_id")
def rotate_secret(phone_number_id: str) -> None:
    """Rotate the number's chat secret through the API and keep the new one."""
    from hookledger import migrate
    from hookledger.database import database

    _check_id(phone_number_id)
    settings = _settings()
    if not settings.api_key:
        _fail("HOOKLEDGER_API_KEY is not set", EXIT_USAGE)

    shown: list[SecretNotStored] = []

    def show(exc: SecretNotStored) -> None:
        # at once, from inside the store's failure: before the pool and the API client
        # close, during which a second Ctrl-C ended the command with the secret unshown
        _show_secret(exc)
        shown.append(exc)

    kept: list[Path | OSError] = []

    def keep(exc: SecretFieldMissing) -> None:  # at once too, inside the rotation's lock
        kept.append(_keep_answer(settings, phone_number_id, exc))

    async def run(url: str) -> Rotated:
        pool = await _open_pool(url)
        try:
            secrets = ChatSecretStore(pool, grace_s=settings.rotation_grace_s)
            async with _api(settings) as api:
                return await rotate(api, secrets, LedgerStore(pool), phone_number_id,
                                    via="cli", on_not_stored=show, on_unread=keep)
        finally:
            await pool.close()

    with database(settings) as url:
        migrate.upgrade(url)  # before the provider issues a secret there must be a table for it
        try:
            rotated = asyncio.run(run(url))
        except KeyboardInterrupt:
            sys.exit(EXIT_SECRET_NOT_STORED if shown else 130)
        except SecretNotStored as exc:
            if not shown:
                _show_secret(exc)
            sys.exit(EXIT_SECRET_NOT_STORED)
        except SecretFieldMissing as exc:
            _answer_kept(phone_number_id, exc,
                         kept[0] if kept else _keep_answer(settings, phone_number_id, exc))
        except RotationError as exc:
            _fail(str(exc))
        except ChatApiError as exc:
            _fail(f"rotation failed: {exc}. If the provider rotated anyway, its new "
                  "deliveries will be refused until you rotate again.")
    _report(rotated, settings)


@chat.command(name="store-secret")
@click.argument("phone_number_id")
@click.option("--from-file", "from_file", type=click.Path(exists=True, dir_okay=False,
                                                          path_type=Path),
              help="read the secret from this file (e.g. a rescued-secrets file)")
@click.option("--field", default=None,
              help="with --from-file: the file is a kept rotate answer (JSON), and the "
                   "secret is this field of it")
def store_secret(phone_number_id: str, from_file: Path | None, field: str | None) -> None:
    """Keep a secret the provider issued that could not be stored at rotation time."""
    from hookledger import migrate
    from hookledger.database import database

    _check_id(phone_number_id)
    settings = _settings()
    if field is not None and from_file is None:
        _fail("--field reads a kept rotate answer: give its file with --from-file", EXIT_USAGE)
    secret = _secret_from_file(from_file, field) if from_file is not None else _typed_secret()

    async def run(url: str) -> Rotated:
        pool = await _open_pool(url)
        try:
            secrets = ChatSecretStore(pool, grace_s=settings.rotation_grace_s)
            # a rescued secret whose number has rotated since is refused (superseded):
            # installing it would retire the secret the provider signs with now
            return await keep_secret(secrets, LedgerStore(pool), phone_number_id, secret,
                                     via="store-secret",
                                     issued_at=issued_at_of(from_file) if from_file else None)
        finally:
            await pool.close()

    with database(settings) as url:
        migrate.upgrade(url)
        try:
            rotated = asyncio.run(run(url))
        except SecretNotStored as exc:
            _fail(f"{exc}; nothing changed", EXIT_SECRET_NOT_STORED)
        except RotationError as exc:
            _fail(str(exc))
    _report(rotated, settings)


@chat.command(name="set-webhook")
@click.argument("phone_number_id")
@click.argument("url")
def set_webhook(phone_number_id: str, url: str) -> None:
    """Point the number's chat webhook at URL (https, or http on a loopback host); warns
    when URL's path does not end in /webhooks/chat/PHONE_NUMBER_ID."""
    _check_id(phone_number_id)
    problem = webhook_url_problem(url)
    if problem:
        _fail(f"{url[:200]!r}: {problem}", EXIT_USAGE)
    warning = webhook_path_warning(url, phone_number_id)
    if warning:  # set all the same: a proxy may rewrite the path
        click.echo(f"warning: {warning}", err=True)
    settings = _settings()

    async def run() -> str:
        async with _api(settings) as api:
            return (await api.set_webhook(phone_number_id, url)).message

    try:
        message = asyncio.run(run())
    except ChatApiError as exc:
        _fail(f"set-webhook failed: {exc}")
    click.echo(f"{phone_number_id}: {message}")
