"""``hookledger project``'s signals: leave while starting, stop at a batch boundary while
projecting, and never cut the embedded server's stop short once projecting has ended."""

from __future__ import annotations

import asyncio
import signal

import pytest

from hookledger.cli import ProjectorSignals
from projections.live import LiveProjector

NOWHERE = "postgresql://hookledger@127.0.0.1:1/nowhere"  # refused at once: the projector retries


def test_a_signal_while_starting_leaves_so_that_what_was_started_is_stopped() -> None:
    with pytest.raises(SystemExit) as left:
        ProjectorSignals().handle(signal.SIGTERM, None)
    assert left.value.code == 0


def test_a_signal_while_projecting_stops_the_projector_and_later_ones_are_ignored() -> None:
    signals = ProjectorSignals()
    projector = LiveProjector(NOWHERE, standby_retry_s=0.05)

    async def project_then_signal() -> None:
        running = asyncio.create_task(signals.run(projector))
        await asyncio.sleep(0.2)  # retrying its connection: still projecting
        assert not running.done()
        signals.handle(signal.SIGTERM, None)
        await asyncio.wait_for(running, timeout=5)

    asyncio.run(project_then_signal())
    signals.handle(signal.SIGINT, None)  # shutting down: neither raises nor stops anything
