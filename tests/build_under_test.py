"""Which hookledger the tests import: the build as installed, not the checkout beside it.

``pip install .`` compiles the hot pure modules (setup.py), so the checkout's ``.py`` files
are not what a user runs. The suite imports the packages with ``--import-mode=append``
(pyproject.toml): the checkout comes last on ``sys.path``, the installed build first, and
children start with ``python -P`` (:data:`HOOKLEDGER`) for the same reason. An editable
install maps the packages to the checkout itself, plain Python.

An installed copy older than the checkout would be tested in its place, passing or failing
for code nobody is looking at: :func:`stale_files` names the files that differ, and the
suite refuses to start while there are any.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
# a child ``hookledger`` command that imports what this process imports (-P: the working
# directory, often the checkout, is not put first on its path)
HOOKLEDGER = [sys.executable, "-P", "-m", "hookledger"]


def _build_info() -> ModuleType | None:
    """:mod:`hookledger.build_info` as installed; ``None`` from an install that predates it."""
    try:
        from hookledger import build_info
    except ImportError:
        return None
    return build_info


def installed_copies() -> dict[str, Path]:
    """Each package imported from somewhere other than the checkout (``pip install .``)."""
    info = _build_info()
    if info is None:
        return {}
    return {name: where for name in info.PACKAGES
            if (where := info.package_folder(name)) != ROOT / name}


def stale_files() -> list[str]:
    """The checkout's source files that its installed copy lacks or holds otherwise."""
    if _build_info() is None:
        return ["hookledger/build_info.py"]
    return differing_files(ROOT, installed_copies())


def differing_files(checkout: Path, copies: dict[str, Path]) -> list[str]:
    """The source files of ``checkout``'s packages that differ from or are missing in
    their copies (package name -> the folder it is installed in)."""
    differing = []
    for name, where in copies.items():
        for source in sorted((checkout / name).rglob("*")):
            if source.suffix not in (".py", ".sql", ".mako") or "__pycache__" in source.parts:
                continue
            relative = source.relative_to(checkout / name)
            copy = where / relative
            if not copy.is_file() or copy.read_bytes() != source.read_bytes():
                differing.append(f"{name}/{relative}")
    return differing


def described() -> str:
    """One line for the test run's header."""
    copies = installed_copies()
    if not copies:
        return "hookledger under test: this checkout, plain Python (an editable install)"
    info = _build_info()
    compiled = info.compiled_modules() if info is not None else []
    place = next(iter(copies.values())).parent
    kind = f"{len(compiled)} modules compiled" if compiled else "plain Python"
    return f"hookledger under test: the build installed in {place} ({kind})"
