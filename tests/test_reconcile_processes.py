"""Two processes run ``hookledger reconcile`` on one database at once: one pass runs, the
other stands aside, and the provider is asked about each subject once."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sandbox.faults import FaultSettings
from sandbox.runner import running_sandbox
from tests.reconcile_helpers import API_KEY, CountingState, body, expect, rows

pytestmark = pytest.mark.slow


def test_two_processes_reconciling_at_once_run_one_pass(db_url: str) -> None:
    state = CountingState()
    references = [f"RP-{i}" for i in range(12)]
    for reference in references:
        state.record_general(body("payment.confirmed", 91000, reference=reference, amount=100))
        expect(db_url, reference, "collection", 100)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOOKLEDGER_")}
    # one request at a time, 500 ms each: the pass lasts six seconds, far longer than the
    # second process can take to start, even on a loaded machine
    with running_sandbox(state=state, faults=FaultSettings(latency_ms=500)) as api:
        env.update(HOOKLEDGER_DATABASE_URL=db_url, HOOKLEDGER_API_BASE_URL=api.url,
                   HOOKLEDGER_API_KEY=API_KEY, HOOKLEDGER_API_CONCURRENCY="1",
                   HOOKLEDGER_LOG_LEVEL="warning")
        procs = [subprocess.Popen([sys.executable, "-m", "hookledger", "reconcile"], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
        outputs = [proc.communicate(timeout=120) for proc in procs]
    said = sorted((out.splitlines()[0], proc.returncode)
                  for proc, (out, _) in zip(procs, outputs, strict=True))
    # the one that found the lock taken says so and exits 3, so a script can tell it from
    # a pass that found nothing
    assert said[0] == ("another reconciliation pass is running; skipped", 3), outputs
    assert said[1][0].startswith("checked 12 subject(s)") and said[1][1] == 0, outputs
    assert sorted(state.asked) == sorted(references) and set(state.asked.values()) == {1}
    assert rows(db_url, "SELECT count(*) FROM hookledger.ledger "
                        "WHERE event_type = 'reconcile.checked'") == [(12,)]
