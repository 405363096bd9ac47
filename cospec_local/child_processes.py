"""Child processes that end with the process that started them, even when it is SIGKILLed: a
training stage and its engine workers otherwise live on as orphans, holding a model and a core
each, after the job that wanted them is gone."""
from __future__ import annotations

import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent_pid: int | None = None) -> None:
    """Call in the child, first thing: the kernel sends it SIGTERM when its parent dies (Linux; a
    no-op elsewhere, where a clean stop of the parent still ends its children). With parent_pid,
    a parent that died before this call ends the child at once."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if parent_pid is not None and os.getppid() != parent_pid:
        os.kill(os.getpid(), signal.SIGTERM)
