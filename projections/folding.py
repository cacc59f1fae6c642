"""What every fold shares: the order of events within a subject, and discrepancy records.

Order within a subject: the domain's own rank first (a refund outranks a confirmation,
``read`` outranks ``delivered``), then the provider's timestamp, then a digest of the event's
dedupe key, then the ledger position. The provider's timestamps have one-second resolution, so rank
must come first: two events in the same second never let the older state win. Two events
of one rank in the same second (two confirmations of one payment with different amounts)
are told apart by their dedupe keys, which come from their content: the ledger position,
which comes from the order they arrived in, would make the state depend on that order.

Descriptive fields (a customer's phone number, a transaction id) are taken from the
highest-ranked event that carries them, tracked per field in ``provenance``: so the final
state depends on the *set* of events, not on the order they arrived in.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

SortKey = tuple[int, float, int, int]
OLD_TIEBREAK = -1  # of a key stored before keys had one: below every tie


def tiebreak(dedupe_key: str) -> int:
    """Orders two events of one rank and second by what they say, not by when they arrived.

    A 32-bit digest of the dedupe key rather than the key: keys are stored in every row's
    marks, and the whole key there added a sixth to the WAL of each delivery (measured).
    Two tied events share it only by a one-in-four-billion chance, and the position then
    decides."""
    return zlib.crc32(dedupe_key.encode())


def sort_key(rank: int, occurred_at: datetime | None, dedupe_key: str,
             position: int) -> SortKey:
    return (rank, occurred_at.timestamp() if occurred_at else 0.0, tiebreak(dedupe_key),
            position)


def key_to_json(key: SortKey) -> list[Any]:
    return list(key)


def key_from_json(value: list[Any]) -> SortKey:
    """A stored key; one folded before keys had a tiebreak loses every tie until
    ``hookledger rebuild`` refolds it."""
    if len(value) == 3:
        return (int(value[0]), float(value[1]), OLD_TIEBREAK, int(value[2]))
    return (int(value[0]), float(value[1]), int(value[2]), int(value[3]))


def merge_descriptive(current: dict[str, Any], provenance: dict[str, list[Any]],
                      incoming: dict[str, Any], key: SortKey
                      ) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """Per field, keep the value from the highest-keyed event that has one."""
    values = dict(current)
    marks = dict(provenance)
    for name, value in incoming.items():
        if value is None:
            continue
        held = marks.get(name)
        if held is None or key > key_from_json(held):
            values[name] = value
            marks[name] = key_to_json(key)
    return values, marks


@dataclass(frozen=True, slots=True)
class Discrepancy:
    """A finding a fold makes; the projector appends it to the ledger as an event."""

    kind: str
    subject: str
    reference: str
    detail: str
    amount_at_risk: Decimal | None
    # what the finding is about, sorted: the dedupe key of the one event it concerns, or
    # marks such as ``outcome:failure`` that name the conflict whatever the arrival order
    evidence: tuple[str, ...]

    @property
    def dedupe_key(self) -> str:
        return f"discrepancy:{self.kind}:{self.subject}:{self.reference}:{','.join(self.evidence)}"


def decimal_or_none(text: Any) -> Decimal | None:
    return None if text is None else Decimal(str(text))
