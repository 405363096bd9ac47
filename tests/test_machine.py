"""The busy-machine check that bench and eval record beside their speed ratios."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from cospec_local.evaluation.machine import BUSY_SHARE, OtherLoad, busy_note

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="reads Linux's /proc/stat")
CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1  # what a share divides by


def burn(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@pytest.mark.slow
def test_another_process_burning_a_cpu_is_seen_and_said():
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)  # running before the measurement starts
        with OtherLoad() as load:
            time.sleep(1.5)
    finally:
        burner.kill()
        burner.wait()
    # One busy CPU of this process's CPUS: about 1/CPUS of their time (0.5 here), less what the scheduler took.
    assert load.share >= 0.6 / CPUS
    assert "rerun with nothing else busy" in busy_note(BUSY_SHARE) and busy_note(BUSY_SHARE * 0.9) is None
    resumed = OtherLoad(**load.totals())  # a resumed eval starts from the saved totals
    assert resumed.share == load.share


@pytest.mark.slow
def test_this_process_own_work_is_not_counted():
    """Burning a CPU here reads as no more load than sleeping (whatever else the machine runs)."""
    with OtherLoad() as idle:
        time.sleep(1.0)
    with OtherLoad() as busy_here:
        burn(1.0)
    assert idle.share is not None and busy_here.share is not None
    assert busy_here.share < idle.share + 0.3 / CPUS
    assert busy_note(0.0) is None and busy_note(None) is None


@pytest.mark.slow
def test_windows_see_only_what_runs_inside_them():
    """eval watches its generations, not the sandboxed scoring between them: load between windows
    is not counted."""
    def burner():
        return subprocess.Popen([sys.executable, "-c", "while True: pass"])

    outside = OtherLoad()
    with outside.window():
        time.sleep(0.5)
    b = burner()
    time.sleep(1.0)
    b.kill()
    b.wait()
    with outside.window():
        time.sleep(0.5)
    inside = OtherLoad()
    b = burner()
    try:
        time.sleep(0.2)
        with inside.window():
            time.sleep(1.0)
    finally:
        b.kill()
        b.wait()
    assert outside.share < inside.share - 0.3 / CPUS
