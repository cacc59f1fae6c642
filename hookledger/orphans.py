"""A worker process ends with the ``serve`` that started it.

``serve`` supervises its HTTP workers and runs the projector itself. If it dies without a
goodbye (``kill -9``, the OOM killer), workers left behind would go on acknowledging
deliveries (durably: they append as before) with no projector beside them, and hold the
port so that the next ``serve`` cannot listen. Each worker therefore asks the kernel for
SIGTERM when its parent dies, which uvicorn answers with its graceful shutdown: requests in
flight are finished and their batches committed, as for any SIGTERM.
"""

from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
SUPERVISOR_PID_VARIABLE = "HOOKLEDGER_INTERNAL_SUPERVISOR_PID"


def end_with_supervisor(supervisor_pid: int | None) -> bool:
    """Arrange SIGTERM for this process when its parent dies; return whether the kernel
    took the request (Linux only; elsewhere a supervisor's sudden death orphans workers).

    A supervisor that died before the request was made is caught by comparing the parent
    with the pid it handed down: this process then terminates itself the same way.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        arranged = libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) == 0
    except (OSError, AttributeError):  # no libc prctl: not Linux
        arranged = False
    if supervisor_pid is not None and os.getppid() != supervisor_pid:
        os.kill(os.getpid(), signal.SIGTERM)
    return arranged
