"""Which instants hookledger stores: those every reader can hold in any time zone.

PostgreSQL keeps a ``timestamptz`` from 4713 BC, while Python's ``datetime`` holds years 1 to
9999 only. An instant near either end (a provider's ``00010101000000`` read at UTC+3 is in
1 BC in UTC) is stored without complaint, and then every read of its row fails: the
projector's batch, retried for ever, a rebuild, a reconciliation pass. Such a timestamp is
never a real delivery's, so it is refused where it enters, as a field that cannot be read.
"""

from __future__ import annotations

from datetime import UTC, datetime

# wide enough for every real delivery, far enough from datetime's ends for any UTC offset
EARLIEST = datetime(1900, 1, 1, tzinfo=UTC)
LATEST = datetime(9998, 1, 1, tzinfo=UTC)


def storable_instant(moment: datetime) -> bool:
    """True when ``moment`` (aware) lies between :data:`EARLIEST` and :data:`LATEST`."""
    try:
        return EARLIEST <= moment.astimezone(UTC) < LATEST
    except (OverflowError, ValueError):  # past datetime's range once moved to UTC
        return False
