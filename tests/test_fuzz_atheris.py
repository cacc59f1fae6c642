"""libFuzzer (atheris) over both header parsers and both body normalisers finds no crash.

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


def test_coverage_guided_fuzzing_finds_no_crash(tmp_path: Path) -> None:
    pytest.importorskip("atheris", reason="atheris has no wheel for this platform")
    script, corpus = str(ROOT / "tests" / "fuzz_atheris.py"), tmp_path / "corpus"
    subprocess.run([sys.executable, script, "--write-seeds", str(corpus)], check=True,
                   cwd=ROOT, timeout=60)
    result = subprocess.run(
        [sys.executable, script, f"-runs={RUNS}", "-max_len=2048", "-seed=20261122",
         f"-artifact_prefix={tmp_path}/", str(corpus)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    tail = (result.stdout + result.stderr)[-3000:]
    assert result.returncode == 0, tail
    assert f"Done {RUNS} runs" in tail, tail
    coverage = int(tail.rsplit("cov: ", 1)[1].split()[0])
    assert coverage > 300, f"fuzzing reached little beyond the seeds (215 edges): {tail}"
