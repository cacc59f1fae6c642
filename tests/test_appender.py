"""Group commit: concurrent callers share batches, and one caller going away harms no one."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from psycopg_pool import AsyncConnectionPool

from ingest.appender import BatchingAppender
from ledger import LedgerStore, NewEvent


def event(i: int) -> NewEvent:
    return NewEvent(stream=f"collection:G-{i}", event_type="payment.confirmed",
                    source="general", dedupe_key=f"general:group-{i}",
                    payload_json=f'{{"reference": "G-{i}"}}',
                    received_at=datetime(2026, 11, 24, 9, 0, i % 60, tzinfo=UTC),
                    facts={"reference": f"G-{i}"}, raw_body=b'{"reference": "G-%d"}' % i,
                    headers={"user-agent": "t"}, endpoint="general/main", verified_by="main")


async def stored_keys(pool: AsyncConnectionPool) -> list[str]:
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT dedupe_key FROM hookledger_private.ledger_events "
                                 "ORDER BY position")
        return [key for (key,) in await cur.fetchall()]


@pytest.mark.anyio
async def test_concurrent_callers_share_batches_and_each_learns_its_own_position(
        pool: AsyncConnectionPool) -> None:
    appender = BatchingAppender(LedgerStore(pool).append)
    appender.start()
    results = await asyncio.gather(*(appender.append(event(i)) for i in range(50)),
                                   appender.append(event(7)))
    await appender.close()
    assert appender.batches < 50  # they queued behind one another's commits
    assert [r.duplicate for r in results] == [False] * 50 + [True]
    assert results[50].position == results[7].position
    positions = [r.position for r in results[:50]]
    assert positions == sorted(positions)  # the ledger's order is the order of arrival
    assert await stored_keys(pool) == [f"general:group-{i}" for i in range(50)]


@pytest.mark.anyio
async def test_a_caller_that_goes_away_cancels_neither_its_batch_nor_the_appender(
        pool: AsyncConnectionPool) -> None:
    """Its event was received and is committed with the rest; only its answer is lost."""
    appender = BatchingAppender(LedgerStore(pool).append)
    appender.start()
    first = asyncio.create_task(appender.append(event(0)))
    await asyncio.sleep(0)  # the appender takes event 0 and starts committing it
    callers = [asyncio.create_task(appender.append(event(i))) for i in range(1, 11)]
    await asyncio.sleep(0)
    callers[4].cancel()  # queued behind event 0's commit
    first.cancel()  # its commit is in flight
    done = await asyncio.gather(first, *callers, return_exceptions=True)
    assert isinstance(done[0], asyncio.CancelledError)
    assert isinstance(done[5], asyncio.CancelledError)
    answered = [r for r in done if not isinstance(r, BaseException)]
    assert len(answered) == 9 and all(not r.duplicate for r in answered)
    later = await appender.append(event(11))
    await appender.close()
    assert not later.duplicate
    assert await stored_keys(pool) == [f"general:group-{i}" for i in range(12)]
