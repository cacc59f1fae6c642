"""Arithmetic on amounts with every digit kept.

``Decimal``'s default context rounds every result to 28 significant digits, and ingest
keeps amounts of more (up to 10**16 TZS, to 10**-15 and past it: ``999999999999999.5``
with fifteen more places is 31 digits). Compared or subtracted in that context, two amounts
a dedupe key keeps apart were one, and a difference was rounded; in :data:`EXACT` nothing
is ever rounded (the values ingest admits are far inside its range).
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import MAX_EMAX, MAX_PREC, MIN_EMIN, Context, Decimal

EXACT = Context(prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN)


def amount_text(amount: Decimal) -> str:
    """One spelling per value, in digits and exactly: ``700``, ``700.00`` and ``7E+2`` are
    ``700``; ``0.5`` stays ``0.5``; a 29th digit is kept; ``-0`` (in facts kept before
    ingest read it as ``0``) is ``0``."""
    return format(amount.normalize(EXACT), "f") if amount else "0"


def difference(high: Decimal, low: Decimal) -> Decimal:
    """``high - low``, exactly."""
    return EXACT.subtract(high, low)


def total(amounts: Iterable[Decimal]) -> Decimal:
    """The sum, exactly: ``sum()`` rounds each addition to 28 digits."""
    result = Decimal(0)
    for amount in amounts:
        result = EXACT.add(result, amount)
    return result


def in_plain_digits(text: str) -> bool:
    """Whether a number given as text is written as every reader of it reads it: ASCII only
    and no ``_``. ``Decimal`` also reads other scripts' digits (``١٢`` as 12) and
    underscores (``1_000``), which PostgreSQL's ``numeric``, a person and a report do not."""
    return text.isascii() and "_" not in text
