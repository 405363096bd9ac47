"""Long jobs killed with SIGKILL at points chosen by seed, then rerun: the result equals an
uninterrupted run's, and a half-written last line (a kill in the middle of a write) is never read
as data. Jobs: `cospec-local eval --out` (records.jsonl) and decision-state collection
(states.jsonl, problems.jsonl)."""
from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

EVAL = [sys.executable, "-m", "cospec_local.cli", "eval", "--task", "arith", "--limit", "10",
        "--runs", "target-only,sps", "-t", "1", "--json", "--fixed-draft"]  # block lengths that never depend on timing
COLLECT = [sys.executable, "-m", "cospec_local.train.collect", "--families", "arith", "--train", "14", "--dev", "4",
           "--threads", "1", "--max-tokens", "96"]
KILL_POINTS = 3


def lines(path: Path) -> int:
    return path.read_text(encoding="utf-8", errors="replace").count("\n") if path.is_file() else 0


def run_killed(command: list[str], log: Path, at_lines: int, timeout: float = 300) -> bool:
    """Start the job and SIGKILL it once `log` holds at_lines lines; False if it finished first."""
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if lines(log) >= at_lines:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                return True
            time.sleep(0.01)
        return False
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def half_written(path: Path) -> None:
    """What a kill in the middle of a write leaves: a line without its end."""
    with path.open("a", encoding="utf-8") as f:
        f.write('{"problem_id": "arith-te')


def whole_then_killed_then_resumed(command: list[str], tmp_path: Path, seed: int, last_point: int, watched: str,
                                   torn: tuple[str, ...], timeout: float):
    """An uninterrupted run into tmp_path/whole; a run into tmp_path/killed, SIGKILLed once `watched`
    holds N lines for KILL_POINTS seeded N below last_point, a half-written line left in each of
    `torn` after every kill, then rerun to its end. Returns (whole, resumed) results."""
    whole = subprocess.run([*command, "--out", str(tmp_path / "whole")], capture_output=True, text=True, timeout=timeout)
    assert whole.returncode == 0, whole.stderr[-2000:]
    out = tmp_path / "killed"
    for at in sorted(random.Random(seed).sample(range(1, last_point), KILL_POINTS)):
        assert run_killed([*command, "--out", str(out)], out / watched, at)
        for name in torn:
            half_written(out / name)
    resumed = subprocess.run([*command, "--out", str(out)], capture_output=True, text=True, timeout=timeout)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    return whole, resumed


@pytest.mark.slow
def test_eval_killed_at_random_points_resumes_to_the_same_records(tmp_path):
    whole, resumed = whole_then_killed_then_resumed(EVAL, tmp_path, 39, 19, "records.jsonl", ("records.jsonl",), 600)

    def records(folder: Path) -> list[tuple]:
        rows = [json.loads(line) for line in (folder / "records.jsonl").read_text().splitlines()]
        return sorted((r["problem_id"], r["run"], r["correct"], r["completion"], r["tokens"], r["drafted"],
                       r["accepted"], r["kept"], r["blocks"]) for r in rows)  # all but the times

    out = tmp_path / "killed"
    assert len(records(out)) == 20 and records(out) == records(tmp_path / "whole")
    assert json.loads(resumed.stdout)["runs"].keys() == json.loads(whole.stdout)["runs"].keys()


@pytest.mark.slow
def test_collection_killed_at_random_points_resumes_to_the_same_states(tmp_path):
    whole_then_killed_then_resumed(COLLECT, tmp_path, 4, 17, "problems.jsonl", ("states.jsonl", "problems.jsonl"), 900)
    for name in ("states.jsonl", "problems.jsonl"):
        assert sorted((tmp_path / "killed" / name).read_text().splitlines()) == \
            sorted((tmp_path / "whole" / name).read_text().splitlines())
