"""Chat secrets in the database: bootstrap, rotation with grace, and the request-path cache."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool
from structlog.testing import capture_logs

from ingest.chat_secrets import ChatSecretError, ChatSecretStore, fingerprint
from ledger import LedgerUnavailable

pytestmark = pytest.mark.anyio

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
GRACE = 600
S1, S2, S3 = "chat-secret-one-111", "chat-secret-two-222", "chat-secret-three-333"


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.value = 1000.0

    def __call__(self) -> float:
        return self.value


def store(pool: AsyncConnectionPool, clock: Clock | None = None) -> ChatSecretStore:
    return ChatSecretStore(pool, grace_s=GRACE, ttl_s=1.0, monotonic=clock or Clock())


async def rows(pool: AsyncConnectionPool) -> list[tuple[str, str, str, bool]]:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT phone_number_id, label, source, retired_at IS NULL "
            "FROM hookledger_private.chat_secrets ORDER BY id")
        return await cur.fetchall()  # type: ignore[return-value]


async def test_bootstrap_inserts_once_and_returns_labels(pool: AsyncConnectionPool) -> None:
    secrets = store(pool)
    labels = await secrets.bootstrap({"111": S1, "222": S2}, NOW)
    again = await secrets.bootstrap({"111": S1, "222": S2}, NOW + timedelta(hours=1))
    assert labels == again == {"111": fingerprint(S1), "222": fingerprint(S2)}
    assert await rows(pool) == [("111", fingerprint(S1), "bootstrap", True),
                                ("222", fingerprint(S2), "bootstrap", True)]
    assert fingerprint(S1).startswith("sha256:") and len(fingerprint(S1)) == 19


async def test_rotation_retires_the_previous_secret_in_the_same_transaction(
        pool: AsyncConnectionPool) -> None:
    secrets = store(pool)
    await secrets.bootstrap({"111": S1}, NOW)
    installed = await secrets.store_rotated("111", S2, NOW + timedelta(minutes=1))
    assert (installed.label, installed.changed) == (fingerprint(S2), True)
    again = await secrets.store_rotated("111", S2, NOW + timedelta(minutes=2))
    assert (again.label, again.changed) == (fingerprint(S2), False)
    assert await rows(pool) == [("111", fingerprint(S1), "bootstrap", False),
                                ("111", fingerprint(S2), "rotation", True)]
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT retired_at FROM hookledger_private.chat_secrets "
                                 "WHERE label = %s", (fingerprint(S1),))
        assert await cur.fetchone() == (NOW + timedelta(minutes=1),)


async def test_storing_the_current_secret_again_is_idempotent(pool: AsyncConnectionPool) -> None:
    secrets = store(pool)
    await secrets.store_rotated("111", S1, NOW)
    await secrets.store_rotated("111", S1, NOW + timedelta(seconds=5))
    assert await rows(pool) == [("111", fingerprint(S1), "rotation", True)]


async def test_a_rotation_never_reinstates_a_retired_secret(pool: AsyncConnectionPool) -> None:
    secrets = store(pool)
    await secrets.bootstrap({"111": S1}, NOW)
    await secrets.store_rotated("111", S2, NOW)
    with pytest.raises(ChatSecretError) as caught:
        await secrets.store_rotated("111", S1, NOW)
    assert caught.value.reason == "retired_secret" and S1 not in str(caught.value)


async def test_a_restart_with_a_stale_configured_secret_does_not_resurrect_it(
        pool: AsyncConnectionPool) -> None:
    secrets = store(pool)
    await secrets.bootstrap({"111": S1}, NOW)
    await secrets.store_rotated("111", S2, NOW)
    await secrets.bootstrap({"111": S1}, NOW + timedelta(days=1))
    later = NOW + timedelta(days=1)
    assert await secrets.valid_secrets("111", later) == [(fingerprint(S2), S2.encode())]


async def test_a_new_configured_secret_replaces_the_current_one(
        pool: AsyncConnectionPool) -> None:
    secrets = store(pool)
    await secrets.bootstrap({"111": S1}, NOW)
    await secrets.bootstrap({"111": S3}, NOW + timedelta(minutes=1))
    assert [r[1:] for r in await rows(pool)] == [(fingerprint(S1), "bootstrap", False),
                                                 (fingerprint(S3), "bootstrap", True)]


async def test_concurrent_rotations_leave_exactly_one_current_secret(
        pool: AsyncConnectionPool) -> None:
    stores = [store(pool) for _ in range(8)]
    await asyncio.gather(*(s.store_rotated("111", f"secret-number-{i:03d}", NOW)
                           for i, s in enumerate(stores)))
    current = [r for r in await rows(pool) if r[3]]
    assert len(current) == 1 and len(await rows(pool)) == 8


async def test_grace_period_edges(pool: AsyncConnectionPool) -> None:
    """The old secret verifies while now - retired_at < grace, never from grace on."""
    secrets = store(pool)
    await secrets.bootstrap({"111": S1}, NOW)
    await secrets.store_rotated("111", S2, NOW)
    labels = [fingerprint(S2), fingerprint(S1)]

    async def valid(at: datetime) -> list[str]:
        secrets.forget()
        return [label for label, _ in await secrets.valid_secrets("111", at)]

    assert await valid(NOW) == labels  # current first
    assert await valid(NOW + timedelta(seconds=GRACE - 0.001)) == labels
    assert await valid(NOW + timedelta(seconds=GRACE)) == [fingerprint(S2)]
    assert await valid(NOW + timedelta(days=30)) == [fingerprint(S2)]


async def test_grace_is_cut_exactly_even_from_the_cache(pool: AsyncConnectionPool) -> None:
    secrets = store(pool)
    await secrets.bootstrap({"111": S1}, NOW)
    await secrets.store_rotated("111", S2, NOW)
    assert len(await secrets.valid_secrets("111", NOW + timedelta(seconds=GRACE - 1))) == 2
    queries = secrets.queries
    assert len(await secrets.valid_secrets("111", NOW + timedelta(seconds=GRACE))) == 1
    assert secrets.queries == queries  # same cached rows, filtered at lookup


async def test_unknown_or_invalid_numbers_have_no_secrets(pool: AsyncConnectionPool) -> None:
    secrets = store(pool)
    assert await secrets.valid_secrets("999", NOW) == []
    assert await secrets.valid_secrets("../etc", NOW) == []
    assert await secrets.valid_secrets("9" * 65, NOW) == []
    assert secrets.queries == 1  # invalid ids never reach the database


async def test_the_cache_queries_once_per_number_per_ttl(pool: AsyncConnectionPool) -> None:
    clock = Clock()
    secrets = store(pool, clock)
    await secrets.bootstrap({"111": S1}, NOW)
    await asyncio.gather(*(secrets.valid_secrets("111", NOW) for _ in range(50)))
    await secrets.valid_secrets("111", NOW)
    assert secrets.queries == 1
    clock.value += 0.99
    await secrets.valid_secrets("111", NOW)
    assert secrets.queries == 1
    clock.value += 0.02
    await secrets.valid_secrets("111", NOW)
    assert secrets.queries == 2


async def test_a_rotation_by_another_process_takes_effect_within_the_ttl(
        pool: AsyncConnectionPool) -> None:
    clock = Clock()
    receiver = store(pool, clock)
    rotator = store(pool)  # stands for the CLI in another process
    await receiver.bootstrap({"111": S1}, NOW)
    assert [lbl for lbl, _ in await receiver.valid_secrets("111", NOW)] == [fingerprint(S1)]
    await rotator.store_rotated("111", S2, NOW)
    clock.value += 1.01
    assert [lbl for lbl, _ in await receiver.valid_secrets("111", NOW)] == [
        fingerprint(S2), fingerprint(S1)]


async def test_a_database_failure_is_not_cached(db_url: str) -> None:
    pool = AsyncConnectionPool(db_url, min_size=1, max_size=1, open=False, timeout=1,
                               kwargs={"autocommit": True})
    await pool.open(wait=True)
    secrets = ChatSecretStore(pool, grace_s=GRACE)
    await secrets.bootstrap({"111": S1}, NOW)
    secrets.forget()
    async with pool.connection():  # hold the only connection: the lookup times out
        from ledger import LedgerUnavailable
        with pytest.raises(LedgerUnavailable):
            await secrets.valid_secrets("111", NOW)
    assert len(await secrets.valid_secrets("111", NOW)) == 1
    await pool.close()


async def test_invalid_input_is_refused_without_echoing_the_secret(
        pool: AsyncConnectionPool) -> None:
    secrets = store(pool)
    for phone, secret in [("bad id", S1), ("111", ""), ("111", "x\x00" + S1)]:
        with pytest.raises(ChatSecretError) as caught:
            await secrets.store_rotated(phone, secret, NOW)
        assert S1 not in str(caught.value)


async def test_no_secret_value_is_ever_logged(pool: AsyncConnectionPool) -> None:
    with capture_logs() as logs:
        secrets = store(pool)
        await secrets.bootstrap({"111": S1}, NOW)
        await secrets.store_rotated("111", S2, NOW)
        await secrets.valid_secrets("111", NOW)
    text = repr(logs)
    assert logs and fingerprint(S1) in text and fingerprint(S2) in text
    assert S1 not in text and S2 not in text


def test_the_table_refuses_two_current_secrets_for_one_number(db_url: str) -> None:
    insert = ("INSERT INTO hookledger_private.chat_secrets "
              "(phone_number_id, secret, label, source, created_at) "
              "VALUES ('111', %s, 'l', 'rotation', now())")
    with psycopg.connect(db_url) as conn:
        conn.execute(insert, ("a",))
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute(insert, ("b",))


async def test_a_lookup_the_database_holds_is_given_up_on_for_every_request_waiting(
        pool: AsyncConnectionPool) -> None:
    """The database holds the lookup (here a lock; in life a partition): the first request
    to wait its time out cancels the query, which frees its connection, and a request that
    joined the same lookup later gives up with it rather than waiting on its own clock."""
    secrets = ChatSecretStore(pool, grace_s=GRACE, ttl_s=1.0, answer_within_s=0.5)
    await secrets.bootstrap({"111": S1}, NOW)
    async with await psycopg.AsyncConnection.connect(pool.conninfo) as holder:
        async with holder.transaction():
            await holder.execute("LOCK TABLE hookledger_private.chat_secrets IN ACCESS "
                                 "EXCLUSIVE MODE")
            loop = asyncio.get_running_loop()
            started = loop.time()

            async def request(delay: float) -> float:
                await asyncio.sleep(delay)
                with pytest.raises(LedgerUnavailable):  # no secrets read before: a 503
                    await secrets.valid_secrets("111", NOW)
                return loop.time() - started

            first, joined = await asyncio.gather(request(0), request(0.3))
            assert 0.5 <= first < 0.75 and joined < 0.75  # not 0.3 + 0.5
            # the query was cancelled in the server: nothing of the store waits on the lock
            for _ in range(50):
                cur = await holder.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query LIKE '%%chat_secrets%%' AND pid <> pg_backend_pid()")
                if (await cur.fetchone()) == (0,):
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("the stalled lookup's query was never cancelled")
    assert await secrets.valid_secrets("111", NOW) == [(fingerprint(S1), S1.encode())]


async def test_the_longest_grace_the_settings_allow_still_verifies_a_retired_secret(
        pool: AsyncConnectionPool) -> None:
    """The bound on HOOKLEDGER_ROTATION_GRACE_S is one the lookup can compute with
    (``now - grace``): past what a date holds, every chat delivery was answered 500."""
    from hookledger.settings import MAX_DURATION_S

    secrets = ChatSecretStore(pool, grace_s=MAX_DURATION_S)
    now = datetime.now(UTC)
    await secrets.bootstrap({"111": S1}, now - timedelta(days=3000))
    await secrets.store_rotated("111", S2, now - timedelta(days=2000))
    assert [label for label, _ in await secrets.valid_secrets("111", now)] == [
        fingerprint(S2), fingerprint(S1)]
