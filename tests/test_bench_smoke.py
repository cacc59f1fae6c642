"""The benchmarks run from a checkout and count correctly (``python -m bench --smoke``).

Sizes are tiny: this proves the harness works (servers start, loads run, every
acknowledged delivery is found), not how fast anything is; figures come from full runs.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_every_benchmark_runs_at_smoke_size_and_counts_what_it_acknowledged(
        tmp_path: Path, bench_tmpdir: Path) -> None:
    env = {**os.environ, "HOOKLEDGER_BENCH_RESULTS": str(tmp_path), "TMPDIR": str(bench_tmpdir)}
    done = subprocess.run([sys.executable, "-m", "bench", "--smoke"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    # each benchmark removes the database cluster it made (a full run's is gigabytes)
    assert sorted(p.name for p in bench_tmpdir.iterdir()) == []
    summary = json.loads((tmp_path / "summary.json").read_text())
    results = summary["results"]
    assert summary["machine"]["cpus"] > 0 and summary["machine"]["cpu"]
    if summary["machine"]["cpus"] >= 2:  # how long a wake-up takes, beside the figures
        assert summary["machine"]["wakeup"]["across_cores_us"] > 0
        assert any(row[0].startswith("machine: one process waking another")
                   for row in summary["rows"])
    # the yardsticks (HMAC and orjson of 1 KB), beside the figures
    assert summary["machine"]["speed"]["hmac_sha256_1kb_us"] > 0
    assert any(row[0] == "machine: the issue's yardsticks" for row in summary["rows"])
    assert all(len(row) == 4 for row in summary["rows"])  # figure, measured, goal, verdict

    ingest = results["ingest"]
    assert {load["label"].split(" (")[0] for load in ingest["loads"]} >= {
        "bare endpoint", "hookledger"}
    assert all(load["ok"] > 0 for load in ingest["loads"])
    # the saturating loads (the bare endpoint, serve without its projector, serve) alternate
    # for two rounds; each ratio pairs one round's runs
    saturating = [load for load in ingest["loads"] if "rounds" in load]
    assert [load["label"].split(" (")[0] for load in saturating] == [
        "bare endpoint", "hookledger", "hookledger"]
    assert "projector off" in saturating[1]["label"]
    assert len(saturating) == 3 and all(len(load["rounds"]) == 2 for load in saturating)
    assert all(sum(r["ok"] for r in load["rounds"]) == load["ok"] for load in saturating)
    assert all(load["p99_ms"] == max(r["p99_ms"] for r in load["rounds"])
               for load in saturating)  # a latency goal is judged on the worst round
    assert {f"{name}_round{r}" for name in ("bare_rows_vs_2xx", "ledger_vs_2xx",
                                             "ledger_vs_2xx_projector_off")
            for r in (1, 2)} <= ingest["checks"].keys()  # every round is counted on its own
    assert len(ingest["ratio_rounds"]) == 2
    assert ingest["ratio_vs_bare"] == pytest.approx(
        statistics.median(ingest["ratio_rounds"]), abs=0.011)
    # the ingest path alone, paired with the same rounds of the bare endpoint
    bare_rounds, off_rounds = saturating[0]["rounds"], saturating[1]["rounds"]
    assert ingest["ratio_projector_off_rounds"] == pytest.approx(
        [o["req_per_s"] / b["req_per_s"] for b, o in zip(bare_rounds, off_rounds, strict=True)],
        abs=0.011)
    assert ingest["ratio_projector_off_vs_bare"] == pytest.approx(
        statistics.median(ingest["ratio_projector_off_rounds"]), abs=0.011)
    if "HOOKLEDGER_BENCH_DATABASE_URL" not in os.environ:  # the embedded server's role may
        assert ingest["checkpoint_before_loads"] is True
    assert any(row[0].strip().startswith("the ingest path alone") for row in summary["rows"])
    for name, (stored, acknowledged) in ingest["checks"].items():
        assert acknowledged > 0 and stored >= acknowledged, name
    assert ingest["ready_seconds"] > 0 and ingest["memory"]["peak_rss_mib"] > 0
    # the scaling pair: an empty ledger, then a second database filled to 20,000 events
    scaling = [load for load in ingest["loads"] if "empty ledger, paired" in load["label"]
               or "20,000 events in the ledger" in load["label"]]
    assert len(scaling) == 2
    assert {"ledger_vs_2xx_SE0", "ledger_vs_2xx_SM0"} <= ingest["checks"].keys()
    assert ingest["scaled_vs_empty"] == pytest.approx(
        scaling[1]["req_per_s"] / scaling[0]["req_per_s"], abs=0.02)
    assert any(load["label"].startswith("hookledger chat at") for load in ingest["loads"])
    assert "ledger_vs_2xx_chat_fixed_rate" in ingest["checks"]
    assert ingest["postgresql"]
    # every fixed-rate load is read beside the disk's fsync stalls under it; no other is
    fixed = [load for load in ingest["loads"] if load["generator"] == "loadgen (open loop)"]
    assert len(fixed) == 4  # bare and hookledger at the fixed rate, chat, the soak
    assert all(load["disk"]["fsyncs"] > 0 for load in fixed)
    assert all(0 <= load["queued_p99_ms"] <= load["p99_ms"] for load in fixed)
    assert not any("disk" in load for load in ingest["loads"] if load not in fixed)
    assert sum(row[0].strip().startswith("the disk meanwhile") for row in summary["rows"]) == 4
    # every saturating load is read beside the checkpoints and new WAL segments under it
    assert all({"checkpoints_begun", "checkpoint_buffers", "wal_files_added"} <= load.keys()
               for load in ingest["loads"] if load not in fixed)
    assert all(load["checkpoint_buffers"] == sum(r["checkpoint_buffers"] for r in load["rounds"])
               for load in saturating)
    assert all(isinstance(load["wal_files_added"], int)  # the embedded server lists pg_wal
               for load in ingest["loads"] if load not in fixed)
    assert sum(row[0].strip() == "checkpoints meanwhile" for row in summary["rows"]) == len(
        [load for load in ingest["loads"] if load not in fixed])
    # and beside the whole machine's CPU: cores busy and CPU per delivery, round by round,
    # from which each round's ratio is read as its two factors
    assert all(load["machine"]["cores_busy"] > 0 and load["machine"]["cpu_us_per_delivery"] > 0
               for load in ingest["loads"] if load not in fixed)
    assert all("machine" in r for load in saturating for r in load["rounds"])
    assert not any("machine" in load for load in fixed)
    assert len(ingest["ratio_parts"]) == 2
    for part, ratio in zip(ingest["ratio_parts"], ingest["ratio_rounds"], strict=True):
        assert part["cpu_per_delivery"] * part["cores_busy"] == pytest.approx(ratio, rel=0.05)
    assert sum(row[0].strip() == "the machine meanwhile" for row in summary["rows"]) == len(
        [load for load in ingest["loads"] if load not in fixed])

    projections = results["projections"]
    assert projections["events"] == 3000 and projections["rebuild_events_per_s"] > 0
    assert projections["lag"]["acknowledged"] == projections["lag"]["sent"]

    assert results["reconcile"]["checked"] == 200
    assert results["chat_storm"]["exactly_once"] is True
