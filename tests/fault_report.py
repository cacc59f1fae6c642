"""Figures of the fault tests (deliveries sent, acknowledged, stored), shown at the end of
the run so that every CI log carries them, whatever pytest's output capture hides."""

from __future__ import annotations

FIGURES: list[str] = []


def record(case: str, *, sent: int, acknowledged: int, stored: int, **extra: object) -> None:
    more = "".join(f", {name.replace('_', ' ')} {value}" for name, value in extra.items())
    FIGURES.append(f"{case}: sent {sent}, acknowledged {acknowledged}, in the ledger "
                   f"{stored}{more}")
