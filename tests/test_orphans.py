"""A worker ends with the ``serve`` that started it (hookledger.orphans), on Linux."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.chat_live import wait_for

ROOT = Path(__file__).resolve().parent.parent
CHILD = ("import os, sys, time; from hookledger.orphans import end_with_supervisor; "
         "print(os.getpid(), flush=True); "
         "print(end_with_supervisor(int(sys.argv[1])), flush=True); time.sleep(60)")
PARENT = ("import os, subprocess, sys, time; "
          "subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2] or str(os.getpid())]); "
          "time.sleep(60)")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="PR_SET_PDEATHSIG is Linux's")


def alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped by whoever adopted it."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "State:\tZ" not in status


def start(supervisor_pid: str) -> tuple[subprocess.Popen[str], int]:
    """A parent process and its child, which has called ``end_with_supervisor``."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD, supervisor_pid],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    return parent, int(parent.stdout.readline())


def test_a_worker_is_terminated_when_its_supervisor_is_killed() -> None:
    parent, child = start("")
    try:
        assert parent.stdout is not None
        assert parent.stdout.readline().strip() == "True"  # the kernel took the request
        assert alive(child)  # the supervisor lives: so does the worker
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        wait_for(lambda: not alive(child), timeout_s=10)
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)


def test_a_worker_whose_supervisor_is_already_gone_terminates_itself() -> None:
    parent, child = start("1")  # not its parent: as if the supervisor died and it was adopted
    try:
        wait_for(lambda: not alive(child), timeout_s=10)
        assert parent.poll() is None  # its actual parent was never touched
    finally:
        parent.kill()
        parent.wait()
        if alive(child):
            os.kill(child, signal.SIGKILL)
