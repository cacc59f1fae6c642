"""Rotating a number's chat secret: ask the provider, keep the answer first, then record it.

The provider shows a new secret once and can never show it again, and from that moment
signs new deliveries with it. So the order is fixed: call, then
:meth:`ChatSecretStore.store_rotated` straight away (one committed transaction), and only
then anything that may fail for other reasons (the ledger event, the answer to the caller).

The spec does not name the field of the rotate answer that holds the secret
(``HOOKLEDGER_CHAT_ROTATE_SECRET_FIELD`` guesses ``secret``). When a successful answer lacks
it, the provider has rotated all the same and the secret is somewhere in that answer: its
``data`` is kept the same way (:func:`rescue_answer_to_file`), and ``hookledger chat
store-secret --from-file FILE --field NAME`` stores the secret from it.

When storing fails, the secret must not be lost. :class:`SecretNotStored` carries it out of
here (never in its message, args or repr); the edge decides where it goes: the command line
prints it once to the operator, the admin API writes it to a 0600 file
(:func:`rescue_to_file`) and answers where. Losing it is recoverable (rotate again once
storage works) but costs deliveries in between, so both edges try hard not to: every
delivery signed with the lost secret is refused, and so, after the grace, are retries of
deliveries queued before (if the provider signs those with the secret of their queueing, as
the sandbox does; the spec does not say).

The rotation is recorded as a ledger event (source ``admin``, ``chat.secret.rotated``) with
the number, the secret's label and the time: never the secret.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import structlog
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ingest.chat_api import (
    ChatApi,
    ChatApiError,
    ChatApiRefused,
    ChatApiUnavailable,
    SecretFieldMissing,
)
from ingest.chat_secrets import (
    ChatSecretError,
    ChatSecretStore,
    fingerprint,
    valid_phone_number_id,
)
from ingest.durable import fsync_folder
from ingest.errors import IngestError
from ledger import LedgerError, LedgerStore, NewEvent
from ledger.jsonenc import dumps

log = structlog.get_logger("hookledger.chat_rotation")

SOURCE = "admin"
ROTATED = "chat.secret.rotated"
RESCUE_DIR = "rescued-secrets"
# how long storing a just-issued secret may take before it counts as not stored (and is
# shown or rescued): a database that stops answering sends no error, and the secret, shown
# once, was held only in memory for as long as the statement waited
STORE_WITHIN_S = 15.0


class RotationError(IngestError):
    """A rotation could not be done as asked."""


class SecretNotStored(RotationError):
    """The provider issued a new secret and it could not be stored; it must be rescued."""

    def __init__(self, phone_number_id: str, label: str, cause: str, secret: str) -> None:
        super().__init__("secret_not_stored",
                         f"new secret {label} of {phone_number_id} could not be stored ({cause})")
        self.phone_number_id = phone_number_id
        self.label = label
        self.__secret = secret  # name-mangled, outside args: no repr/str/log shows it

    def reveal(self) -> str:
        """The secret, for the one place that hands it to the operator."""
        return self.__secret


@dataclass(frozen=True, slots=True)
class Rotated:
    phone_number_id: str
    label: str
    at: datetime
    recorded: bool  # the ledger event is in (or already was)
    changed: bool = True  # False: it already was the number's current secret


def rotation_event(phone_number_id: str, label: str, at: datetime, *, via: str) -> NewEvent:
    """The ledger event of a rotation; idempotent per (number, secret). Pure."""
    payload = {"phone_number_id": phone_number_id, "label": label, "rotated_at": at,
               "via": via}
    return NewEvent(stream=f"chat-number:{phone_number_id}", event_type=ROTATED,
                    source=SOURCE, dedupe_key=f"admin:{ROTATED}:{phone_number_id}:{label}",
                    payload_json=dumps(payload), received_at=at, facts=payload)


NotStoredHandler = Callable[[SecretNotStored], None]


async def keep_secret(secrets: ChatSecretStore, ledger: LedgerStore, phone_number_id: str,
                      secret: str, *, via: str, issued_at: datetime | None = None,
                      on_not_stored: NotStoredHandler | None = None,
                      clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> Rotated:
    """Store a just-issued secret, then record the rotation. Raises :class:`SecretNotStored`,
    or :class:`RotationError` ``superseded`` for a secret issued at ``issued_at`` that a
    later rotation has replaced (nothing to rescue: see :func:`install_in`).

    ``on_not_stored`` is called with the secret that could not be stored before anything
    else happens, also when what interrupted the store is no error to raise it with: a
    second Ctrl-C raises KeyboardInterrupt, which ended the command with the secret in an
    exception nobody caught, never shown."""
    at = clock()
    try:
        async with asyncio.timeout(STORE_WITHIN_S):
            installed = await secrets.store_rotated(phone_number_id, secret, at,
                                                    issued_at=issued_at)
    except ChatSecretError as exc:
        if exc.reason != "superseded":
            raise _not_stored(phone_number_id, secret, exc, on_not_stored) from None
        raise RotationError(exc.reason, f"{exc.detail}; nothing changed") from None
    # whatever failed, the secret goes back out: cancellation too (Ctrl-C on a database that
    # hangs, a shutdown), which is no Exception and took the secret with it, never shown
    except (Exception, asyncio.CancelledError) as exc:  # noqa: BLE001
        raise _not_stored(phone_number_id, secret, exc, on_not_stored) from None
    except BaseException as exc:  # KeyboardInterrupt, SystemExit: handed over, then go on
        _not_stored(phone_number_id, secret, exc, on_not_stored)
        raise
    label = installed.label
    try:
        await ledger.append([rotation_event(phone_number_id, label, at, via=via)])
        recorded = True
    except LedgerError as exc:
        log.warning("chat_secret.rotation_not_recorded", phone_number_id=phone_number_id,
                    label=label, error=type(exc).__name__)
        recorded = False
    return Rotated(phone_number_id, label, at, recorded, installed.changed)


def _not_stored(phone_number_id: str, secret: str, exc: BaseException,
                on_not_stored: NotStoredHandler | None) -> SecretNotStored:
    cause = getattr(exc, "reason", None) or type(exc).__name__
    log.error("chat_secret.not_stored", phone_number_id=phone_number_id,
              label=fingerprint(secret), cause=cause)
    not_stored = SecretNotStored(phone_number_id, fingerprint(secret), cause, secret)
    if on_not_stored is not None:
        on_not_stored(not_stored)
    return not_stored


RESCUED_NAME = re.compile(
    r"-(\d{8}T\d{6})(\.\d{6})?Z(?:-[0-9a-f]+\.secret|\.answer\.json)$")


def issued_at_of(kept_in: Path) -> datetime | None:
    """By when the secret kept in a rescue file was issued, by the file's name (see
    :func:`rescue_to_file`, :func:`rescue_answer_to_file`), since the file is written after
    the answer came and before the rotation's lock is let go: the instant it names, or the
    end of its second for a name of earlier releases, which named no fraction (a second
    rotation within that second was then taken for an older one). None for another
    name. Pure."""
    found = RESCUED_NAME.search(kept_in.name)
    if found is None:
        return None
    named = datetime.strptime(found.group(1), "%Y%m%dT%H%M%S").replace(tzinfo=UTC)
    if found.group(2) is None:
        return named + timedelta(seconds=1)
    return named + timedelta(microseconds=int(found.group(2)[1:]))


async def rotate(api: ChatApi, secrets: ChatSecretStore, ledger: LedgerStore,
                 phone_number_id: str, *, via: str,
                 on_not_stored: NotStoredHandler | None = None,
                 on_unread: Callable[[SecretFieldMissing], None] | None = None,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> Rotated:
    """Rotate through the provider and keep the new secret before anything else.

    ``on_not_stored`` and ``on_unread`` (an answer with no secret where it was looked for)
    are called while the rotation's lock is held, so that what they keep is on the disk
    before another rotation can begin (by the rescue file's name, a later rotation is
    then always later: :func:`issued_at_of`), and before letting go of the lock waits on
    a database that stopped answering."""
    if not valid_phone_number_id(phone_number_id):
        raise RotationError("invalid_phone_number_id",
                            f"phone number id {phone_number_id[:80]!r} is not a valid id")
    try:
        # only taking the lock raises ChatSecretError: keep_secret turns whatever storing
        # raises into SecretNotStored, and the provider's errors are ChatApiError
        async with secrets.rotation_lock(phone_number_id):
            try:
                secret = await api.rotate_secret(phone_number_id)
            except SecretFieldMissing as exc:
                if on_unread is not None:
                    on_unread(exc)
                raise
            return await keep_secret(secrets, ledger, phone_number_id, secret, via=via,
                                     on_not_stored=on_not_stored, clock=clock)
    except ChatSecretError as exc:
        raise RotationError(exc.reason, exc.detail) from None


def rescue_to_file(home: Path, phone_number_id: str, label: str, secret: str,
                   at: datetime) -> Path:
    """Write a secret that could not be stored to a new 0600 file (folder 0700); fsynced."""
    name = (f"{phone_number_id}-{at.strftime('%Y%m%dT%H%M%S.%fZ')}-"
            f"{label.split(':')[-1]}.secret")
    return _private_file(home, name, secret.encode("utf-8") + b"\n")


def rescue_answer_to_file(home: Path, phone_number_id: str, data: dict[str, Any],
                          at: datetime) -> Path:
    """Write the ``data`` of a rotate answer that held no secret where it was looked for
    to a new 0600 file, as JSON: the new secret is in there, under a field of its own."""
    name = f"{phone_number_id}-{at.strftime('%Y%m%dT%H%M%S.%fZ')}.answer.json"
    content = json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    return _private_file(home, name, content.encode("utf-8"))


FIELD_PLACEHOLDER = "FIELD"


def store_secret_command(phone_number_id: str, kept_in: Path | None, *,
                         field: str | None = None) -> str:
    """The ``hookledger chat store-secret`` command that stores a secret kept in a file
    (``kept_in``; None: one the operator pastes on stdin), as a shell line: quoted, so that
    it runs as printed from any ``HOOKLEDGER_HOME`` (one with a space in it, say). An id may
    begin with ``-``, which the CLI would read as an option: such an id comes last, after
    ``--``. Pure."""
    options = [] if kept_in is None else ["--from-file", str(kept_in)]
    if field is not None:
        options += ["--field", field]
    command = ["hookledger", "chat", "store-secret"]
    if phone_number_id.startswith("-"):
        return shlex.join([*command, *options, "--", phone_number_id])
    return shlex.join([*command, phone_number_id, *options])


def kept_answer_command(phone_number_id: str, kept_in: Path) -> str:
    """The command that stores the secret from a kept rotate answer, its field left as
    :data:`FIELD_PLACEHOLDER` for the operator to name. Pure."""
    return store_secret_command(phone_number_id, kept_in, field=FIELD_PLACEHOLDER)


def answer_kept_advice(phone_number_id: str, kept_in: Path) -> str:
    """What an operator does with a rotate answer kept by :func:`rescue_answer_to_file`:
    the same words from the CLI and the admin route."""
    command = kept_answer_command(phone_number_id, kept_in)
    return ("The provider already signs new deliveries with the new secret and will never "
            f"show it again. Its answer was kept in {kept_in} (mode 0600). Set "
            f"HOOKLEDGER_CHAT_ROTATE_SECRET_FIELD to the field that holds the secret, store "
            f"the secret with the command below ({FIELD_PLACEHOLDER} being that field), then "
            f"delete the file:\n{command}")


def secret_kept_advice(phone_number_id: str, kept_in: Path) -> str:
    """What an operator does with a secret kept by :func:`rescue_to_file`."""
    return ("The provider already signs new deliveries with it. It was written to "
            f"{kept_in} (mode 0600); once the database is fixed, store it with the command "
            f"below, then delete the file:\n{store_secret_command(phone_number_id, kept_in)}")


def answer_lost_advice() -> str:
    """What an operator does when such an answer could not be kept either."""
    return ("Set HOOKLEDGER_CHAT_ROTATE_SECRET_FIELD to the field that holds the secret and "
            "rotate again; deliveries signed with the new secret are refused meanwhile and "
            "retried by the provider.")


def _private_file(home: Path, name: str, content: bytes) -> Path:
    """A new file only its owner reads, in a folder only its owner enters; fsynced, and so
    is the folder's entry for it."""
    folder = home / RESCUE_DIR
    created = not folder.exists()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    if created:  # the folder's own entry, or a crash could take the folder and the secret
        fsync_folder(home)
    path = folder / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:  # a buffered write takes all of it, as chat media's does
        out.write(content)
        out.flush()
        os.fsync(out.fileno())
    fsync_folder(folder)
    return path.resolve()


@dataclass
class ChatOps:
    """What the admin route needs from the running service (set on ``app.state.chat_ops``)."""

    secrets: ChatSecretStore
    ledger: LedgerStore
    home: Path
    api: Callable[[], ChatApi] | None  # None: HOOKLEDGER_API_BASE_URL is not set


def _answer(status: int, **body: Any) -> JSONResponse:
    return JSONResponse(body, status_code=status)


@dataclass(frozen=True, slots=True)
class UnreadAnswer:
    """A rotation whose answer held no secret in the configured field, and the file its
    ``data`` was kept in (None: writing that failed too)."""

    error: SecretFieldMissing
    rescued_to: Path | None


async def rescue_answer(home: Path, phone_number_id: str,
                        exc: SecretFieldMissing) -> Path | None:
    """Keep an answer that held no readable secret; None (logged) when that fails."""
    return await asyncio.to_thread(rescue_answer_now, home, phone_number_id, exc)


def rescue_answer_now(home: Path, phone_number_id: str,
                      exc: SecretFieldMissing) -> Path | None:
    """:func:`rescue_answer`, in this thread (see :func:`rescue_now`)."""
    try:
        path = rescue_answer_to_file(home, phone_number_id, exc.reveal_data(),
                                     datetime.now(UTC))
    except OSError as io_error:
        log.error("chat_secret.answer_lost", phone_number_id=phone_number_id,
                  fields=exc.fields, error=type(io_error).__name__)
        return None
    log.error("chat_secret.answer_rescued", phone_number_id=phone_number_id,
              fields=exc.fields, path=str(path))
    return path


@dataclass(frozen=True, slots=True)
class Unstored:
    """A rotation whose new secret could not be stored, and the file it was rescued to
    (None: writing that failed too)."""

    error: SecretNotStored
    rescued_to: Path | None


async def rescue(home: Path, exc: SecretNotStored) -> Path | None:
    """Write an unstored secret to a rescue file; None (logged) when that fails as well."""
    return await asyncio.to_thread(rescue_now, home, exc)


def rescue_now(home: Path, exc: SecretNotStored) -> Path | None:
    """:func:`rescue`, in this thread: for the moment storing failed, before the rotation's
    lock is let go (on a database that stopped answering, that can wait as long again)."""
    try:
        path = rescue_to_file(home, exc.phone_number_id, exc.label, exc.reveal(),
                              datetime.now(UTC))
    except OSError as io_error:
        log.error("chat_secret.lost", phone_number_id=exc.phone_number_id, label=exc.label,
                  error=type(io_error).__name__)
        return None
    log.error("chat_secret.rescued", phone_number_id=exc.phone_number_id, label=exc.label,
              path=str(path))
    return path


async def rotate_or_rescue(ops: ChatOps, make_api: Callable[[], ChatApi],
                           phone_number_id: str) -> Rotated | Unstored | UnreadAnswer:
    """Rotate, and rescue a secret that could not be stored, as ONE piece of work.

    The route shields this from a caller who hangs up; the rescue belongs inside the shield,
    since a caller cancelled before the provider answered never reaches its own handler,
    and a secret the provider shows once would be neither stored nor rescued."""
    rescued: list[Path | None] = []

    def at_once(exc: SecretNotStored) -> None:  # on the disk before anything else can wait
        rescued.append(rescue_now(ops.home, exc))

    def answer_at_once(exc: SecretFieldMissing) -> None:
        rescued.append(rescue_answer_now(ops.home, phone_number_id, exc))

    try:
        async with make_api() as api:
            return await rotate(api, ops.secrets, ops.ledger, phone_number_id, via="admin",
                                on_not_stored=at_once, on_unread=answer_at_once)
    except SecretNotStored as exc:
        return Unstored(exc, rescued[0] if rescued else await rescue(ops.home, exc))
    except SecretFieldMissing as exc:
        return UnreadAnswer(exc, rescued[0] if rescued
                            else await rescue_answer(ops.home, phone_number_id, exc))


async def admin_rotate_secret(request: Request) -> Response:
    """``POST /api/chat/{phone_number_id}/rotate-secret``: answers the label, never the secret."""
    ops: ChatOps = request.app.state.chat_ops
    phone_number_id = request.path_params["phone_number_id"]
    if not valid_phone_number_id(phone_number_id):
        return _answer(400, error="bad_request", detail="not a valid phone number id")
    make_api = ops.api
    if make_api is None:
        return _answer(503, error="api_not_configured",
                       detail="HOOKLEDGER_API_BASE_URL is not set")

    # shielded: a caller who hangs up must not cancel us between the answer and the store
    try:
        outcome = await asyncio.shield(asyncio.create_task(
            rotate_or_rescue(ops, make_api, phone_number_id)))
    except RotationError as exc:
        status = {"rotation_in_progress": 409, "database_unavailable": 503}.get(exc.reason, 400)
        return _answer(status, error=exc.reason, detail=exc.detail)
    except ChatApiUnavailable as exc:
        return _answer(503, error="provider_unavailable", detail=str(exc))
    except ChatApiRefused as exc:
        return _answer(502, error="provider_refused", detail=str(exc), code=exc.code)
    except ChatApiError as exc:
        return _answer(502, error="provider_answer_unusable", detail=str(exc))
    if isinstance(outcome, UnreadAnswer):
        return _unread_answer(phone_number_id, outcome)
    if isinstance(outcome, Unstored):
        error = outcome.error
        if outcome.rescued_to is None:
            return _answer(500, error="secret_lost", phone_number_id=phone_number_id,
                           label=error.label, detail=(
                               f"{error}; writing it to a rescue file failed too. Rotate again "
                               "once storage works; deliveries signed with it are refused "
                               "meanwhile and retried by the provider."))
        return _answer(500, error="secret_not_stored", phone_number_id=phone_number_id,
                       label=error.label, rescued_to=str(outcome.rescued_to),
                       command=store_secret_command(phone_number_id, outcome.rescued_to),
                       detail=(f"{error}. "
                               f"{secret_kept_advice(phone_number_id, outcome.rescued_to)}"))
    return _answer(200, phone_number_id=outcome.phone_number_id, label=outcome.label,
                   rotated_at=outcome.at.isoformat(), recorded=outcome.recorded)


def _unread_answer(phone_number_id: str, outcome: UnreadAnswer) -> JSONResponse:
    error = outcome.error
    if outcome.rescued_to is None:
        return _answer(502, error=error.reason, phone_number_id=phone_number_id,
                       fields=error.fields, detail=(
                           f"{error}; keeping the answer in a rescue file failed too. "
                           f"{answer_lost_advice()}"))
    return _answer(502, error=error.reason, phone_number_id=phone_number_id,
                   fields=error.fields, rescued_to=str(outcome.rescued_to),
                   command=kept_answer_command(phone_number_id, outcome.rescued_to),
                   detail=f"{error}. {answer_kept_advice(phone_number_id, outcome.rescued_to)}")


ROTATE_RESPONSE_SCHEMA = {"type": "object", "properties": {
    "phone_number_id": {"type": "string"}, "label": {"type": "string"},
    "rotated_at": {"type": "string", "format": "date-time"}, "recorded": {"type": "boolean"}}}
