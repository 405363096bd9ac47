"""The machine a measurement ran on: what it is, and how busy the rest of it was meanwhile.

Greedy tokens are reproducible on one machine, but llama.cpp's kernels differ between CPUs (AVX2,
AVX-512, AMX) and round differently, so a near tie can fall the other way on another CPU: eval
records name the CPU and llama.cpp's features (machine_identity).

Speed ratios mean little when something else shares the CPUs: a training job beside a bench once
moved a ratio from 1.18x to 0.89x. The kernel's count of busy time on the CPUs this process may run
on (/proc/stat's lines for its affinity mask), less this process's own time, is what other work
took there (other processes, and a VM's steal time: the hypervisor running other guests); bench
and eval record it as a share of those CPUs' time and say so when it is large. This process's
children count as its own only once reaped, so a window must not span a child's life (eval's
windows hold the generations; its sandboxed scoring runs between them). Linux only; elsewhere
nothing is measured (None)."""
from __future__ import annotations

import os
import resource
import time

# Above this share of the CPUs' time taken by other work, ratios are called unreliable.
BUSY_SHARE = 0.10


def _cpus() -> set[int]:
    try:
        return os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def _busy_seconds(cpus: set[int]) -> float | None:
    """These CPUs' busy time since boot (every state but idle and iowait; steal included), or None
    off Linux."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            lines = [line.split() for line in f if line.startswith("cpu") and not line.startswith("cpu ")]
    except OSError:
        return None
    ticks = 0
    seen = 0
    for fields in lines:
        if fields[0][3:].isdigit() and int(fields[0][3:]) in cpus:
            values = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
            ticks += sum(values) - values[3] - values[4]  # guest time is already in user time
            seen += 1
    return ticks / os.sysconf("SC_CLK_TCK") if seen else None


def _own_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def other_share(other_s: float, cpu_s: float) -> float | None:
    """Other work's CPU seconds as a share of the CPUs' seconds (None when nothing was watched)."""
    return max(0.0, min(1.0, other_s / cpu_s)) if cpu_s > 0 else None


class OtherLoad:
    """Use as `with OtherLoad() as load: ...`, or around each timed part with `with load.window():`;
    then load.share is the share of this process's CPUs' time that other work took in those windows
    (0 on an idle machine, 1 if it kept every one of them busy). A resumed measurement starts from
    the totals an earlier one saved (totals(), OtherLoad(**saved))."""

    def __init__(self, wall_s: float = 0.0, other_s: float = 0.0, cpu_s: float = 0.0) -> None:
        self._wall, self._other, self._capacity = wall_s, other_s, cpu_s
        self._cpus = _cpus()
        self._start = None

    @property
    def share(self) -> float | None:
        return other_share(self._other, self._capacity)

    def totals(self) -> dict:
        return {"wall_s": self._wall, "other_s": self._other, "cpu_s": self._capacity}

    def __enter__(self) -> OtherLoad:
        self._start = (time.monotonic(), _busy_seconds(self._cpus), _own_seconds())
        return self

    def __exit__(self, *exc) -> None:
        wall0, busy0, own0 = self._start
        busy1 = _busy_seconds(self._cpus)
        if busy0 is None or busy1 is None:
            return
        wall = time.monotonic() - wall0
        self._wall += wall
        self._other += (busy1 - busy0) - (_own_seconds() - own0)
        self._capacity += wall * len(self._cpus)

    def window(self) -> OtherLoad:
        """One more timed part (the kernel counts in 10 ms ticks: over many short windows the
        rounding evens out)."""
        return self


def machine_identity() -> dict:
    """The CPU's model name and llama.cpp's view of the machine (backends, CPU features)."""
    import platform

    from .. import _cospec

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu": cpu, "cpus": os.cpu_count(), "llama_cpp": _cospec.system_info().strip(),
            "version": _cospec.version()}


def busy_note(share: float | None) -> str | None:
    """A plain warning where other work took enough of this process's CPUs to move speed ratios."""
    if share is None or share < BUSY_SHARE:
        return None
    return (f"other work took {share:.0%} of this process's CPUs' time during the run: the speed ratios "
            f"are unreliable; rerun with nothing else busy")
