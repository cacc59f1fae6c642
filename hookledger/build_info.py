"""Which of hookledger's modules run compiled (mypyc, see setup.py) in this installation.

Figures from a compiled build and from plain Python differ by a tenth or more, so the
bench records which one it measured, and the test run's header says which one it tested.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path

PACKAGES = ("hookledger", "ingest", "ledger", "migrations", "projections", "reconcile",
            "sandbox")


def package_folder(package: str) -> Path:
    """The folder ``package`` is imported from, without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(package)
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def compiled_modules() -> list[str]:
    """The dotted names of the modules that import as compiled extensions."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    found = []
    for package in PACKAGES:
        folder = package_folder(package)
        for library in folder.rglob("*"):
            if library.name.endswith(suffixes):
                module = library.name.split(".", 1)[0]
                found.append(".".join((package, *library.parent.relative_to(folder).parts,
                                       module)))
    return sorted(found)
