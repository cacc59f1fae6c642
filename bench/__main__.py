"""Every benchmark, one after the other, then one table: ``python -m bench [--smoke]``.

Each benchmark runs in its own process (a clean interpreter, its own database) and writes
its JSON to ``bench/results/``; this collects them into ``bench/results/summary.json`` with
the machine's description and prints the table. ``--smoke`` runs every one at a size that
takes seconds: it proves the benchmarks run and count correctly, not how fast anything is.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.checkpoints import described as checkpoints_described
from bench.common import RESULTS, machine
from bench.disk_probe import described
from bench.machine_cpu import described as machine_described
from bench.machine_cpu import parts_described
from bench.speed_probe import described as speed_described
from bench.wakeup_probe import described as wakeup_described

FULL: dict[str, list[str]] = {
    "ingest": [],
    "projections": [],
    "reconcile": [],
    "chat_storm": [],
}
SMOKE: dict[str, list[str]] = {
    "ingest": ["--seconds", "1", "--scale-events", "20000", "--fixed-rate", "200",
               "--fixed-seconds", "1", "--soak-seconds", "1", "--rounds", "2",
               "--scale-rounds", "1"],
    "projections": ["--events", "3000", "--rate", "100", "--seconds", "1"],
    "reconcile": ["--expectations", "200", "--discrepancies", "500", "--latency-ms", "5"],
    "chat_storm": ["--deliveries", "50", "--copies", "3", "--concurrency", "8"],
}
MODULES = {"ingest": "bench.ingest_bench", "projections": "bench.projections_bench",
           "reconcile": "bench.reconcile_bench", "chat_storm": "bench.chat_storm"}


def latest(pattern: str) -> dict[str, Any]:
    files = sorted(RESULTS.glob(pattern), key=lambda p: p.stat().st_mtime)
    return json.loads(files[-1].read_text()) if files else {}


def collect() -> dict[str, Any]:
    return {"ingest": latest("ingest.json"), "projections": latest("projections.json"),
            "reconcile": latest("reconcile-*.json"), "chat_storm": latest("chat_storm.json")}


Row = tuple[str, str, str, str]  # figure, measured, goal, verdict ("met", "NOT MET", "")


def verdict(ok: bool | None) -> str:
    return "" if ok is None else ("met" if ok else "NOT MET")


def load_goal(label: str, p99_ms: float) -> tuple[str, str]:
    """The p99 goals of the performance issue, by the load's label."""
    if label.startswith("hookledger (") and "empty ledger" in label:
        return "p99 <= 50 ms", verdict(p99_ms <= 50)
    if label.startswith("hookledger") and label.endswith("/s") and " at " in label:
        return "p99 <= 20 ms", verdict(p99_ms <= 20)
    return "", ""


def _median_of(ratios: list[float]) -> str:
    """`` (median of 1.2x, 0.9x)`` after a ratio taken over several rounds, else nothing."""
    return f" (median of {', '.join(f'{x}x' for x in ratios)})" if len(ratios) > 1 else ""


def table(results: dict[str, Any]) -> list[Row]:
    """(figure, measured, goal, verdict) rows from whatever the benchmarks wrote."""
    rows: list[Row] = []
    ingest = results.get("ingest") or {}
    if "wakeup" in ingest.get("machine", {}):  # the machine's wake-up cost (wakeup_probe.py)
        rows.append(("machine: one process waking another, round trip",
                     wakeup_described(ingest["machine"]["wakeup"]), "", ""))
    if "speed" in ingest.get("machine", {}):  # against the machine (speed_probe.py)
        rows.append(("machine: the issue's yardsticks",
                     speed_described(ingest["machine"]["speed"]), "", ""))
    for load in ingest.get("loads", []):
        rows.append((f"{load['label']}: req/s, p50/p99 ms",
                     f"{load['req_per_s']:,}, {load['p50_ms']}/{load['p99_ms']}",
                     *load_goal(load["label"], load["p99_ms"])))
        if "disk" in load:  # what a fixed-rate tail is read beside (bench/disk_probe.py)
            rows.append(("  the disk meanwhile", described(load["disk"]), "", ""))
            rows.append(("  waiting for a free generator connection: p99 ms",
                         str(load.get("queued_p99_ms")), "", ""))
        if "checkpoint_buffers" in load:  # a saturating tail is read beside these
            rows.append(("  checkpoints meanwhile", checkpoints_described(load), "", ""))
        if "machine" in load:  # a ratio is CPU per delivery times cores busy
            rows.append(("  the machine meanwhile",
                         machine_described(load["machine"], load.get("rounds")), "", ""))
    if ingest:
        ratio = ingest["ratio_vs_bare"]
        rows.append(("ingest: hookledger / bare endpoint",
                     f"{ratio}x{_median_of(ingest.get('ratio_rounds', []))}", ">= 1.5x",
                     verdict(ratio >= 1.5)))
        if ingest.get("ratio_parts"):
            rows.append(("  each round's ratio as", parts_described(ingest["ratio_parts"]),
                         "", ""))
        if "ratio_projector_off_vs_bare" in ingest:  # the ingest path alone: no goal
            off = ingest["ratio_projector_off_vs_bare"]
            rows.append(("  the ingest path alone: hookledger with its projector off / bare",
                         f"{off}x{_median_of(ingest.get('ratio_projector_off_rounds', []))}",
                         "", ""))
        if "scaled_vs_empty" in ingest:
            scaled = ingest["scaled_vs_empty"]
            rows.append(("ingest: large ledger / empty ledger",
                         f"{scaled}x{_median_of(ingest.get('scaled_rounds', []))}",
                         ">= 0.9x", verdict(scaled >= 0.9)))
        for name, (found, acked) in ingest.get("checks", {}).items():
            rows.append((f"check {name}", f"{found:,} stored / {acked:,} acknowledged",
                         "stored >= acknowledged", verdict(found >= acked)))
        memory = ingest.get("memory", {})
        if memory:
            rows.append(("memory: peak RSS under load (supervisor + workers)",
                         f"{memory['peak_rss_mib']:.0f} MiB", "< 300 MiB",
                         verdict(memory["peak_rss_mib"] < 300)))
            before, after = memory["rss_before_soak_mib"], memory["rss_after_soak_mib"]
            rows.append(("memory: RSS before / after the soak", f"{before:.0f} / {after:.0f} MiB",
                         "not growing (<= +10%)", verdict(after <= before * 1.1)))
        if "ready_seconds" in ingest:
            ready = ingest["ready_seconds"]
            rows.append(("serve ready on a fresh home", f"{ready} s", "< 10 s",
                         verdict(ready < 10)))
    proj = results.get("projections") or {}
    if proj:
        rows.append((f"projector, live ({proj['events']:,} events)",
                     f"{proj['live_projector_events_per_s']:,} events/s", "", ""))
        rebuild = proj["rebuild_events_per_s"]
        rows.append(("rebuild", f"{rebuild:,} events/s", ">= 20,000 events/s",
                     verdict(rebuild >= 20_000)))
        lag = proj.get("lag", {})
        p99 = lag.get("lag_p99_ms")
        rows.append((f"commit-to-view lag at {lag.get('achieved_rate')}/s, p50/p99",
                     f"{lag.get('lag_p50_ms')}/{p99} ms", "p99 <= 500 ms",
                     verdict(None if p99 is None else p99 <= 500)))
    rec = results.get("reconcile") or {}
    if rec:
        rows.append((f"reconcile {rec['expectations']:,} expectations "
                     f"({rec['latency_ms']} ms API latency)",
                     f"{rec['reconcile_seconds']} s ({rec['reconcile_per_s']}/s)", "< 60 s",
                     verdict(rec["reconcile_seconds"] < 60)))
        rows.append((f"report of {rec['discrepancies']:,} discrepancies from the database, "
                     "all formats written; peak memory",
                     f"{rec['report_total_seconds']} s; {rec['report_peak_rss_mib']} MiB",
                     "< 10 s", verdict(rec["report_total_seconds"] < 10)))
    chat = results.get("chat_storm") or {}
    if chat:
        rows.append((f"chat retry storm ({chat['requests']:,} requests), req/s, p99 ms",
                     f"{chat['requests_per_s']:,}, {chat['latency_ms']['p99']}", "", ""))
        rows.append(("chat storm exactly once", str(chat["exactly_once"]), "True",
                     verdict(bool(chat["exactly_once"]))))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: seconds, not minutes")
    parser.add_argument("--only", choices=sorted(MODULES), action="append")
    args = parser.parse_args()
    sizes = SMOKE if args.smoke else FULL
    started = time.perf_counter()
    failed = []
    for name in args.only or list(MODULES):
        print(f"== {name}", flush=True)
        code = subprocess.call([sys.executable, "-m", MODULES[name], *sizes[name]],
                               cwd=Path(__file__).resolve().parent.parent)
        if code:
            failed.append(name)
    results = collect()
    rows = table(results)
    width = max((len(r[0]) for r in rows), default=10)
    print(f"\n{'figure':{width}}  {'measured':32}  {'goal':24}  verdict")
    for figure, measured, goal, judged in rows:
        print(f"{figure:{width}}  {measured:32}  {goal:24}  {judged}")
    summary = {"machine": machine(), "smoke": args.smoke, "rows": rows, "results": results,
               "seconds": round(time.perf_counter() - started, 1)}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print(f"written {RESULTS / 'summary.json'}")
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
