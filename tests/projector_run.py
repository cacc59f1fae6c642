"""Run the projector on a database until killed: the victim of the crash-safety test."""

from __future__ import annotations

import asyncio
import sys

import psycopg

from projections.projector import project_batch


async def main(url: str, batch_size: int) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        while True:
            if await project_batch(conn, batch_size=batch_size) == 0:
                await asyncio.sleep(0.01)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
