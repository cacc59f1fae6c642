"""Each connected number's chat webhook secrets, kept in the database, read through a cache.

Rotation and grace
------------------
A number has one current secret (``retired_at`` NULL) and possibly some rotated out. A
rotation (:meth:`ChatSecretStore.store_rotated`) inserts the new secret and retires the
current one in ONE transaction, so there is never a moment with two current secrets or
none. A retired secret still verifies while ``now - retired_at < grace_s``
(``HOOKLEDGER_ROTATION_GRACE_S``): deliveries the provider queued before the rotation were
signed with it. The request path asks :meth:`ChatSecretStore.valid_secrets`, which keeps
each number's rows for ``ttl_s`` (about a second) and applies the grace cut-off on every
lookup, so the database sees at most one cheap indexed query per number per TTL while a
rotation stored by any process takes effect everywhere within that TTL.

Bootstrap (``HOOKLEDGER_CHAT_SECRETS``) inserts a configured secret the database does not
know yet; a secret it already knows, current or retired, changes nothing, so a restart with
a stale environment never resurrects a rotated-out secret. An unknown configured secret for
a number that already has one is taken as the operator's rotation (source ``bootstrap``).

Secrets never leave this module except as ``bytes`` handed to the verifier: only the
``label`` (``sha256:`` and 12 hex digits of the secret's SHA-256) is logged or returned.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
import structlog
from psycopg_pool import AsyncConnectionPool

from ingest.errors import IngestError
from ledger.errors import LedgerUnavailable
from ledger.sqlfiles import load
from ledger.store import translated_errors

log = structlog.get_logger("hookledger.chat_secrets")

MAX_PHONE_NUMBER_ID = 64
MAX_SECRET = 1024
# how long the rotation lock's session may sit idle in its transaction before the server
# ends it, releasing the lock (see ``rotation_lock``)
ROTATION_LOCK_IDLE_S = 120.0
_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")


class ChatSecretError(IngestError):
    """A chat secret could not be stored as asked (the message names the number only)."""


def fingerprint(secret: str) -> str:
    """The label of a secret: safe to log, enough to tell secrets apart."""
    return "sha256:" + hashlib.sha256(secret.encode("utf-8")).hexdigest()[:12]


def valid_phone_number_id(value: str) -> bool:
    """Ids are short tokens; anything else is refused without a database query."""
    return 0 < len(value) <= MAX_PHONE_NUMBER_ID and _ID_CHARS.issuperset(value)


def _check(phone_number_id: str, secret: str) -> None:
    # messages name the number, never the secret
    if not valid_phone_number_id(phone_number_id):
        raise ChatSecretError("invalid_phone_number_id",
                              f"phone number id {phone_number_id[:80]!r} is not a valid id")
    if not secret or len(secret) > MAX_SECRET or "\x00" in secret:
        raise ChatSecretError(
            "invalid_secret",
            f"the secret for {phone_number_id} must be 1-{MAX_SECRET} characters, no NUL")


@dataclass(frozen=True, slots=True)
class _Row:
    label: str
    secret: bytes
    retired_at: datetime | None


@dataclass(frozen=True, slots=True)
class Installed:
    """What storing a secret did; carries the label only."""

    label: str
    changed: bool
    retired: tuple[str, ...] = ()


def _sql(name: str) -> str:
    return load("ingest", name)


async def install_in(conn: psycopg.AsyncConnection[Any], phone_number_id: str, secret: str,
                     now: datetime, *, source: str,
                     issued_at: datetime | None = None) -> Installed:
    """Make ``secret`` the number's current one, within the caller's transaction.

    Idempotent for the current secret. A known retired secret is left retired: a rotation
    that hands one back is refused, a bootstrap of one changes nothing. A secret the
    provider issued at ``issued_at`` (one rescued when storing it failed) is refused when
    the current one was stored after that: a later rotation has replaced it at the
    provider, and installing it would retire the secret the provider signs with.
    """
    _check(phone_number_id, secret)
    label = fingerprint(secret)
    params = {"phone_number_id": phone_number_id, "secret": secret, "now": now,
              "source": source, "label": label}
    await conn.execute(_sql("chat_secrets_lock"), params)
    cur = await conn.execute(_sql("chat_secrets_find"), params)
    found = await cur.fetchone()
    if found is not None:
        _, retired_at = found
        if retired_at is not None and source == "rotation":
            raise ChatSecretError(
                "retired_secret",
                f"refusing to reinstate retired secret {label} of {phone_number_id}")
        return Installed(label, changed=False)
    if issued_at is not None:
        cur = await conn.execute(_sql("chat_secrets_current"), params)
        current = await cur.fetchone()
        if current is not None and current[1] > issued_at:
            raise ChatSecretError(
                "superseded",
                f"{current[0]} has been the current secret of {phone_number_id} since "
                f"{current[1].isoformat()}, after this one ({label}) was issued at "
                f"{issued_at.isoformat()}: a later rotation replaced it at the provider")
    cur = await conn.execute(_sql("chat_secrets_retire_current"), params)
    retired = tuple(row[0] for row in await cur.fetchall())
    await conn.execute(_sql("chat_secrets_insert"), params)
    return Installed(label, changed=True, retired=retired)


class ChatSecretStore:
    """Chat secrets over the pool, with a short-lived per-number cache for the request path
    (read past its time only while the database cannot be reached)."""

    def __init__(self, pool: AsyncConnectionPool, *, grace_s: float, ttl_s: float = 1.0,
                 max_entries: int = 10_000, acquire_timeout_s: float = 5.0,
                 answer_within_s: float | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._pool = pool
        # a database that stops answering (no error) is given up on after this long, as if
        # it could not be reached; None waits for its answer
        self._answer_within_s = answer_within_s
        # well inside the platform's wait for an answer: a lookup that cannot get a
        # connection soon falls back to the secrets read last (below) or answers 503
        self._acquire_timeout_s = acquire_timeout_s
        self._grace = timedelta(seconds=grace_s)
        self._ttl = ttl_s
        self._max_entries = max_entries
        self._monotonic = monotonic
        self._cache: dict[str, tuple[float, tuple[_Row, ...]]] = {}
        self._inflight: dict[str, asyncio.Task[tuple[_Row, ...]]] = {}
        self.queries = 0

    # -- writes ---------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def rotation_lock(self, phone_number_id: str) -> AsyncIterator[None]:
        """Held around asking the provider for a new secret and storing it.

        Two rotations of one number at once (two operators, the CLI beside the admin route)
        each got a secret; the provider signs with the later, and the one stored last was
        current, retiring the provider's own after the grace, from when every delivery of
        the number was refused. The second is refused instead (``rotation_in_progress``),
        before it asks the provider; a database that cannot be reached refuses it too
        (``database_unavailable``): a secret that could not be stored is not asked for.

        A transaction's lock, on a connection of its own: it ends with the transaction,
        however the rotation ends (the pool rolls back or drops a connection handed back
        mid-transaction, cancelled or broken)."""
        params = {"phone_number_id": phone_number_id}
        conn: psycopg.AsyncConnection[Any] | None = None
        try:
            try:
                conn = await self._pool.getconn(timeout=self._acquire_timeout_s)
                await conn.execute("BEGIN")
                # the lock's session sits idle in its transaction while the provider is
                # asked and the secret stored: cut off by a network blip, the server kept
                # it, and the lock, until the kernel gave up on the socket (hours), every
                # rotation of the number refused meanwhile. Bounded for this transaction
                # only (the connection goes back to the pool), well past asking (10 s)
                # and storing (15 s), so only a session nobody drives any more is ended
                await conn.execute(
                    "SELECT set_config('idle_in_transaction_session_timeout', %s, true)",
                    (str(int(ROTATION_LOCK_IDLE_S * 1000)),))
                cur = await conn.execute(_sql("chat_secrets_rotation_lock"), params)
                row = await cur.fetchone()
            except psycopg.Error as exc:  # PoolTimeout too
                raise ChatSecretError(
                    "database_unavailable",
                    f"database unavailable ({type(exc).__name__}); nothing rotated") from None
            if not (row and row[0]):
                raise ChatSecretError(
                    "rotation_in_progress",
                    f"another rotation of {phone_number_id} is in progress; nothing rotated")
            yield
        finally:
            if conn is not None:
                with contextlib.suppress(psycopg.Error):
                    await conn.execute("ROLLBACK")  # the lock is all it held
                await self._pool.putconn(conn)

    async def store_rotated(self, phone_number_id: str, new_secret: str,
                            now: datetime, *, issued_at: datetime | None = None) -> Installed:
        """Keep a secret the provider just issued; retire the previous one. Returns its label
        and whether anything changed (the number's current secret again changes nothing).

        One transaction; committed when this returns. Call it before anything else can fail:
        the provider shows a new secret once.
        """
        async with translated_errors(), self._pool.connection() as conn:
            async with conn.transaction():
                installed = await install_in(conn, phone_number_id, new_secret, now,
                                             source="rotation", issued_at=issued_at)
        self._cache.pop(phone_number_id, None)
        log.info("chat_secret.rotated", phone_number_id=phone_number_id,
                 label=installed.label, retired=list(installed.retired),
                 changed=installed.changed)
        return installed

    async def bootstrap(self, secrets: Mapping[str, str], now: datetime) -> dict[str, str]:
        """Insert configured secrets the database does not know yet; return number -> label."""
        labels: dict[str, str] = {}
        for phone_number_id, secret in sorted(secrets.items()):
            async with translated_errors(), self._pool.connection() as conn:
                async with conn.transaction():
                    installed = await install_in(conn, phone_number_id, secret, now,
                                                 source="bootstrap")
            labels[phone_number_id] = installed.label
            if installed.changed:
                log.info("chat_secret.bootstrapped", phone_number_id=phone_number_id,
                         label=installed.label, retired=list(installed.retired))
            self._cache.pop(phone_number_id, None)
        return labels

    # -- reads ----------------------------------------------------------------------------

    async def valid_secrets(self, phone_number_id: str,
                            now: datetime) -> list[tuple[str, bytes]]:
        """``(label, secret)`` pairs that verify at ``now``, current first; [] if none."""
        if not valid_phone_number_id(phone_number_id):
            return []
        rows = await self._rows(phone_number_id, now)
        return [(row.label, row.secret) for row in rows
                if row.retired_at is None or now - row.retired_at < self._grace]

    async def _rows(self, phone_number_id: str, now: datetime) -> tuple[_Row, ...]:
        cached = self._cache.get(phone_number_id)
        if cached is not None and cached[0] > self._monotonic():
            return cached[1]
        task = self._inflight.get(phone_number_id)
        if task is None:  # one query per number, however many requests wait on it
            task = asyncio.create_task(self._fetch(phone_number_id, now))
            self._inflight[phone_number_id] = task
            task.add_done_callback(lambda done: self._settled(phone_number_id, done))
        try:
            return await self._answer(phone_number_id, task)
        except LedgerUnavailable:
            # the database is down: secrets read in the last grace period still verify
            # (retirement is still judged at ``now``: a rotation this process has not seen
            # is honoured no longer than its grace would be), and the delivery goes to the
            # spool, not a 503. No rows read (an unknown number) stays a 503, never a 401.
            if cached is None or not cached[1] or \
                    self._monotonic() - (cached[0] - self._ttl) > self._grace.total_seconds():
                raise
            log.warning("chat_secret.stale_while_unavailable", phone_number_id=phone_number_id)
            return cached[1]

    async def _answer(self, phone_number_id: str,
                      task: asyncio.Task[tuple[_Row, ...]]) -> tuple[_Row, ...]:
        """The lookup's rows, or :class:`LedgerUnavailable` once the database has not
        answered in time, as when it cannot be reached: the first request to give up
        cancels the lookup (psycopg cancels its query and frees the connection, which a
        silent database would hold for as long as TCP retries), and every other request
        waiting on it gives up with it."""
        try:
            # shield: a request that goes away must not cancel the lookup others wait on
            return await asyncio.wait_for(asyncio.shield(task), self._answer_within_s)
        except TimeoutError as exc:
            if self._inflight.get(phone_number_id) is task:
                del self._inflight[phone_number_id]  # the next lookup asks afresh
            task.cancel()
            raise LedgerUnavailable("the database did not answer in time") from exc
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancelled() and current is not None and not current.cancelling():
                raise LedgerUnavailable("another request gave up on this lookup") from None
            raise

    def _settled(self, phone_number_id: str, task: asyncio.Task[tuple[_Row, ...]]) -> None:
        if self._inflight.get(phone_number_id) is task:
            del self._inflight[phone_number_id]
        if task.cancelled() or task.exception() is not None:  # retrieved: never cached
            return
        self._remember(phone_number_id, task.result())

    async def _fetch(self, phone_number_id: str, now: datetime) -> tuple[_Row, ...]:
        self.queries += 1
        async with translated_errors(), \
                self._pool.connection(timeout=self._acquire_timeout_s) as conn:
            cur = await conn.execute(_sql("chat_secrets_valid"), {
                "phone_number_id": phone_number_id, "since": now - self._grace})
            fetched = await cur.fetchall()
        return tuple(_Row(label, secret.encode("utf-8"), retired_at)
                     for label, secret, retired_at in fetched)

    def _remember(self, phone_number_id: str, rows: tuple[_Row, ...]) -> None:
        if len(self._cache) >= self._max_entries:
            # bounded: a spray of made-up numbers cannot grow memory; expired entries go
            # first, else everything (the next TTL refills what is really used)
            clock = self._monotonic()
            for key in [k for k, (expires, _) in self._cache.items() if expires <= clock]:
                del self._cache[key]
            if len(self._cache) >= self._max_entries:
                self._cache.clear()
        self._cache[phone_number_id] = (self._monotonic() + self._ttl, rows)

    def forget(self, phone_number_id: str | None = None) -> None:
        """Drop cached rows (one number, or all): the next lookup reads the database."""
        if phone_number_id is None:
            self._cache.clear()
        else:
            self._cache.pop(phone_number_id, None)
