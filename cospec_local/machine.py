"""The machine a measurement ran on: what it is, and how busy the rest of it was meanwhile.

Greedy tokens are reproducible on one machine, but llama.cpp's kernels differ between CPUs (AVX2,
AVX-512, AMX) and round differently, so a near tie can fall the other way on another CPU: eval
records name the CPU and llama.cpp's features (machine_identity).

Speed ratios mean little when something else shares the CPUs: a training job beside a bench once
moved a ratio from 1.18x to 0.89x. The kernel's count of busy CPU time (/proc/stat), less this
process's own and its children's, is the other processes' share; bench and eval record it and say
so when it is large. Linux only; elsewhere nothing is measured (None)."""
from __future__ import annotations

import os
import resource
import time

# Above this share of the machine's CPU time used by other processes, ratios are called unreliable.
BUSY_SHARE = 0.10


def _busy_seconds() -> float | None:
    """All CPUs' busy time since boot (every state but idle and iowait), or None off Linux."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(v) for v in fields[1:]]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    # guest time is already counted in user time
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class OtherLoad:
    """Use as `with OtherLoad() as load: ...`, or around each timed part with `with load.window():`
    (eval times generation, not the sandboxed scoring between, whose processes in their own
    namespaces this process's counters do not see); then load.share is the share of all CPUs' time
    other processes used in those windows (0 on an idle machine, 1 if they kept every CPU busy)."""

    def __init__(self) -> None:
        self.share: float | None = None
        self._wall = self._other = 0.0
        self._start = None

    def __enter__(self) -> OtherLoad:
        self._start = (time.monotonic(), _busy_seconds(), _own_seconds())
        return self

    def __exit__(self, *exc) -> None:
        wall0, busy0, own0 = self._start
        busy1 = _busy_seconds()
        if busy0 is None or busy1 is None:
            return
        self._wall += time.monotonic() - wall0
        self._other += (busy1 - busy0) - (_own_seconds() - own0)
        if self._wall > 0:
            self.share = max(0.0, min(1.0, self._other / (self._wall * (os.cpu_count() or 1))))

    def window(self) -> OtherLoad:
        """One more timed part (the kernel counts in 10 ms ticks: over many short windows the
        rounding evens out)."""
        return self


def machine_identity() -> dict:
    """The CPU's model name and llama.cpp's view of the machine (backends, CPU features)."""
    import platform

    from . import _cospec

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu": cpu, "cpus": os.cpu_count(), "llama_cpp": _cospec.system_info().strip(),
            "version": _cospec.version()}


def busy_note(share: float | None) -> str | None:
    """A plain warning where other processes used enough of the machine to move speed ratios."""
    if share is None or share < BUSY_SHARE:
        return None
    return (f"other processes used {share:.0%} of this machine's CPU time during the run: the speed ratios "
            f"are unreliable; rerun with nothing else busy")
