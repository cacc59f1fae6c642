"""The installation's build: the hot modules compiled, or all of it plain Python."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from hookledger.build_info import compiled_modules
from tests.build_under_test import ROOT, differing_files, installed_copies


def listed_for_compiling() -> list[str]:
    """setup.py's ``COMPILED_MODULES`` as dotted names, read without running setup.py."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                getattr(t, "id", None) == "COMPILED_MODULES" for t in node.targets):
            paths = ast.literal_eval(node.value)
            return sorted(p.removesuffix(".py").replace("/", ".") for p in paths)
    raise AssertionError("setup.py lists no COMPILED_MODULES")


def test_the_build_under_test_compiled_every_listed_module() -> None:
    """A compiler failing in CI only warns (plain Python is a working install): without
    this, the suite would pass on plain Python while users ran something else."""
    if not installed_copies():
        pytest.skip("an editable install: the checkout itself, plain Python")
    if os.environ.get("HOOKLEDGER_BUILD_PURE_PYTHON", "") not in ("", "0"):
        pytest.skip("installed with HOOKLEDGER_BUILD_PURE_PYTHON")
    assert compiled_modules() == listed_for_compiling()


def test_an_edited_checkout_is_told_from_its_installed_copy(tmp_path: Path) -> None:
    checkout, installed = tmp_path / "checkout", tmp_path / "site-packages"
    for root in (checkout, installed):
        (root / "ledger" / "sql").mkdir(parents=True)
        (root / "ledger" / "money.py").write_text("A = 1\n")
        (root / "ledger" / "sql" / "append.sql").write_text("SELECT 1\n")
    (installed / "ledger" / "money.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\0")
    copies = {"ledger": installed / "ledger"}
    assert differing_files(checkout, copies) == []

    (checkout / "ledger" / "money.py").write_text("A = 2\n")
    (checkout / "ledger" / "new.py").write_text("")
    (checkout / "ledger" / "sql" / "append.sql").write_text("SELECT 2\n")
    (checkout / "ledger" / "notes.txt").write_text("not a source")
    assert differing_files(checkout, copies) == [
        "ledger/money.py", "ledger/new.py", "ledger/sql/append.sql"]


@pytest.mark.slow
def test_without_a_compiler_the_install_is_plain_python(tmp_path: Path) -> None:
    """All or none: the compiled modules share one runtime library, so a build that fails
    part way must leave no module behind that cannot be imported."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the checkout's git to copy its files")
    source = tmp_path / "source"
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                            check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    env = {**os.environ, "CC": "false", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("HOOKLEDGER_BUILD_PURE_PYTHON", None)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(tmp_path / "out"),
         str(source)], env=env, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert "installing plain Python instead" in built.stdout + built.stderr
    (wheel,) = (tmp_path / "out").glob("hookledger-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "projections/general_folds.py" in names
    assert [n for n in names if n.endswith(".so")] == []
