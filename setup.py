"""Build: everything is declared in pyproject.toml; this file only adds the compiled modules.

The pure functions every delivery and every fold run through (reading a body, checking its
signature, folding an event into its row) are compiled with mypyc, from the same typed
Python, when the package is built into an installation (``pip install .``). Compiled, they
took ingest from 6,100-7,100 to 7,000-7,900 deliveries a second on the 2-core development
machine (the README's "Compiled modules"). Nothing else changes: the same
source is the documentation, the tests run against the build as installed, and a machine
that cannot compile gets the same modules as plain Python.

Left as plain Python on purpose:

* an editable install (``pip install -e .``): a module compiled next to its source would
  keep running after that source was edited, until the next build;
* ``HOOKLEDGER_BUILD_PURE_PYTHON=1`` at install time, for a platform where the compiled build
  misbehaves or to compare the two;
* any build where mypyc or a C compiler is missing or fails: a warning, then plain Python.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

# pure functions only: no I/O, no async, no classes that subclass a library's
COMPILED_MODULES = [
    "ingest/chat_body.py",
    "ingest/chat_signature.py",
    "ingest/general_body.py",
    "ingest/general_signature.py",
    "ingest/json_body.py",
    "ingest/json_syntax.py",
    "ledger/instants.py",
    "ledger/money.py",
    "projections/chat_folds.py",
    "projections/folding.py",
    "projections/general_folds.py",
]
GROUP_NAME = "hookledger_compiled"  # the runtime all compiled modules share


def _warn(message: str) -> None:
    print(f"hookledger: {message}; installing plain Python instead", file=sys.stderr)


class OptionalBuildExt(build_ext):
    """All the compiled modules or none: they share one runtime library, so a build that
    failed half way would leave modules that cannot be imported."""

    def run(self) -> None:
        if getattr(self, "editable_mode", False):
            return  # an editable install runs its sources as they are edited
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any failure here has the same way out
            _warn(f"compiling failed ({type(exc).__name__}: {exc})")
            self._remove_built()

    def _remove_built(self) -> None:
        for extension in self.extensions:
            Path(self.get_ext_fullpath(extension.name)).unlink(missing_ok=True)
        self.extensions = []


def compiled_extensions() -> list[Any]:
    if os.environ.get("HOOKLEDGER_BUILD_PURE_PYTHON", "") not in ("", "0"):
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        _warn("mypyc is not installed")
        return []
    try:
        return list(mypycify(COMPILED_MODULES, opt_level="3", group_name=GROUP_NAME))
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - mypyc exits on a type error
        _warn(f"mypyc could not translate the modules ({type(exc).__name__}: {exc})")
        return []


setup(ext_modules=compiled_extensions(), cmdclass={"build_ext": OptionalBuildExt})
