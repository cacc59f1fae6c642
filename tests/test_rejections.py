"""The rejected-deliveries table cannot be used to fill the disk."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from psycopg_pool import AsyncConnectionPool

from ingest.rejections import UNVERIFIED_PREFIX_BYTES, Refusal, RejectionLog

pytestmark = pytest.mark.anyio


def refusal(i: int, body: bytes = b"junk") -> Refusal:
    return Refusal(datetime.now(UTC), "general/main", "bad_signature", f"n={i}", False, 401,
                   body, len(body), {"user-agent": "flood"}, "127.0.0.1")


async def test_a_flood_keeps_only_the_newest_rows_and_short_prefixes(
        pool: AsyncConnectionPool) -> None:
    log = RejectionLog(pool, keep=10, prune_every=4)
    for i in range(60):
        await log.record(refusal(i, body=b"x" * 100_000))
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT detail, octet_length(body_prefix), body_size "
            "FROM hookledger.rejected_deliveries ORDER BY received_at")
        rows = await cur.fetchall()
    assert 10 <= len(rows) < 10 + 4  # the newest 10, plus at most one round since pruning
    assert rows[-1][0] == "n=59" and rows[-10][0] == f"n={59 - 9}"
    assert {(prefix, size) for _, prefix, size in rows} == {(UNVERIFIED_PREFIX_BYTES, 100_000)}
