"""libFuzzer (atheris) over both header parsers and both body normalisers finds no crash.

Guided by coverage over the checkout's plain source, then the inputs it found, mutated
further, through the build as installed (compiled: see ``tests/fuzz_atheris.py``).

atheris ships wheels for Linux on x86_64 only; elsewhere the hypothesis fuzz tests
(``test_fuzz_bodies.py``, the signature tests) still run and this one says why it did not.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUNS = 500_000
INSTALLED_RUNS = 100_000  # from the grown corpus, without coverage to guide it


def test_coverage_guided_fuzzing_finds_no_crash(tmp_path: Path) -> None:
    pytest.importorskip("atheris", reason="atheris has no wheel for this platform")
    script, corpus = str(ROOT / "tests" / "fuzz_atheris.py"), tmp_path / "corpus"
    subprocess.run([sys.executable, script, "--write-seeds", str(corpus)], check=True,
                   cwd=ROOT, timeout=60)
    tail = fuzz(script, "--source", f"-runs={RUNS}", f"-artifact_prefix={tmp_path}/",
                str(corpus))
    coverage = int(tail.rsplit("cov: ", 1)[1].split()[0])
    assert coverage > 300, f"fuzzing reached little beyond the seeds (215 edges): {tail}"
    found = len(list(corpus.iterdir()))
    assert found > 50, f"the corpus grew to {found} inputs only"
    fuzz(script, f"-runs={INSTALLED_RUNS}", f"-artifact_prefix={tmp_path}/installed-",
         str(corpus))


def fuzz(script: str, *args: str) -> str:
    """Run the fuzzer to the end; return its output's tail (a crash fails the test)."""
    result = subprocess.run(
        [sys.executable, script, *args, "-max_len=2048", "-seed=20261122"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    tail = (result.stdout + result.stderr)[-3000:]
    assert result.returncode == 0, tail
    runs = next(a for a in args if a.startswith("-runs=")).removeprefix("-runs=")
    assert f"Done {runs} runs" in tail, tail
    return tail
