"""Benchmarks: each prints its figures and writes JSON under bench/results/.

They measure hookledger as installed: ``pip install .`` compiles its hot pure modules
(setup.py), and ``python -m bench`` run from the checkout would otherwise import the
checkout's plain sources first. So the checkout moves to the end of the import path here
(the bench itself is found there still), as the tests do (tests/build_under_test.py), and
the services the bench starts run with ``python -P``. With an editable install both are the
checkout, as plain Python.
"""

import sys
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parent.parent


def _checkout_last() -> None:
    first = [p for p in sys.path if Path(p or ".").resolve() != _CHECKOUT]
    if len(first) != len(sys.path):
        sys.path[:] = [*first, str(_CHECKOUT)]


_checkout_last()
