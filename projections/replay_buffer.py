"""Write-behind rows for a full replay (``rebuild`` and ``verify``).

A replay runs in one transaction that nobody else can see until it commits, so the rows
in between need not be written after every batch as the live projector must. They stay in
memory, most recently touched last, and are written once: when the buffer outgrows its
limit (the least recently touched go first) and at the end. On a ledger where most
subjects see several events, that turns one upsert per event into about one insert per
subject, and a subject's later events never ask the database for its row.

The replay emptied the tables itself and holds the checkpoint lock, so a key that was never
written out is known to have no row in the database and is not looked up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from projections.registry import Row


class ReplayBuffer:
    """Rows of every projection a replay has folded and not yet written."""

    def __init__(self, limit: int = 400_000) -> None:
        self.limit = limit
        self._rows: dict[tuple[str, str], Row] = {}
        self._written: set[tuple[str, str]] = set()

    def __len__(self) -> int:
        return len(self._rows)

    def known(self, table: str, keys: Sequence[str]) -> tuple[dict[str, Row], list[str]]:
        """Rows held for ``keys``, and the keys whose row must be read from the database."""
        held: dict[str, Row] = {}
        to_load: list[str] = []
        for key in keys:
            row = self._rows.get((table, key))
            if row is not None:
                held[key] = row
            elif (table, key) in self._written:
                to_load.append(key)
        return held, to_load

    def keep(self, table: str, key_column: str, rows: Sequence[Row]) -> None:
        for row in rows:
            slot = (table, row[key_column])
            self._rows.pop(slot, None)  # re-inserting moves it to the recent end
            self._rows[slot] = row

    def overflow(self) -> Spill:
        """Take the least recently touched rows past the limit (a tenth more, so that
        spills come in few large writes), grouped by table, to be written now."""
        excess = len(self._rows) - self.limit
        if excess <= 0:
            return Spill()
        return self._take(list(self._rows)[:excess + self.limit // 10])

    def drain(self) -> Spill:
        """Take every row still held, grouped by table, to be written at the end."""
        return self._take(list(self._rows))

    def _take(self, slots: list[tuple[str, str]]) -> Spill:
        spill = Spill()
        for slot in slots:
            into = spill.again if slot in self._written else spill.fresh
            into.setdefault(slot[0], []).append(self._rows.pop(slot))
            self._written.add(slot)
        return spill


@dataclass
class Spill:
    """Rows to write, by table: ``fresh`` ones have no row in the database yet (a plain
    insert will do), the ``again`` ones were written earlier in the replay (an upsert)."""

    fresh: dict[str, list[Row]] = field(default_factory=dict)
    again: dict[str, list[Row]] = field(default_factory=dict)

