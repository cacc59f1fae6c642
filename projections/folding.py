"""What every fold shares: the order of events within a subject, and discrepancy records.

Order within a subject: the domain's own rank first (a refund outranks a confirmation,
``read`` outranks ``delivered``), then the provider's timestamp, then the ledger position.
The provider's timestamps have one-second resolution, so rank must come first: two events
in the same second never let the older state win.

Descriptive fields (a customer's phone number, a transaction id) are taken from the
highest-ranked event that carries them, tracked per field in ``provenance``: so the final
state depends on the *set* of events, not on the order they arrived in.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

SortKey = tuple[int, float, int]


def sort_key(rank: int, occurred_at: datetime | None, position: int) -> SortKey:
    return (rank, occurred_at.timestamp() if occurred_at else 0.0, position)


def key_to_json(key: SortKey) -> list[Any]:
    return [key[0], key[1], key[2]]


def key_from_json(value: list[Any]) -> SortKey:
    return (int(value[0]), float(value[1]), int(value[2]))


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
