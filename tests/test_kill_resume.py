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


def test_eval_killed_at_random_points_resumes_to_the_same_records(tmp_path):
    whole = subprocess.run([*EVAL, "--out", str(tmp_path / "whole")], capture_output=True, text=True, timeout=600)
    assert whole.returncode == 0, whole.stderr[-2000:]
    out = tmp_path / "killed"
    rng = random.Random(39)
    points = sorted(rng.sample(range(1, 19), KILL_POINTS))
    for at in points:
        assert run_killed([*EVAL, "--out", str(out)], out / "records.jsonl", at)
        half_written(out / "records.jsonl")
    resumed = subprocess.run([*EVAL, "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]

    def records(folder: Path) -> list[tuple]:
        rows = [json.loads(line) for line in (folder / "records.jsonl").read_text().splitlines()]
        return sorted((r["problem_id"], r["run"], r["correct"], r["completion"], r["tokens"], r["drafted"],
                       r["accepted"], r["kept"], r["blocks"]) for r in rows)  # all but the times

    assert len(records(out)) == 20 and records(out) == records(tmp_path / "whole")
    assert json.loads(resumed.stdout)["runs"].keys() == json.loads(whole.stdout)["runs"].keys()


def test_collection_killed_at_random_points_resumes_to_the_same_states(tmp_path):
    whole = subprocess.run([*COLLECT, "--out", str(tmp_path / "whole")], capture_output=True, text=True, timeout=900)
    assert whole.returncode == 0, whole.stderr[-2000:]
    out = tmp_path / "killed"
    rng = random.Random(4)
    points = sorted(rng.sample(range(1, 17), KILL_POINTS))
    for at in points:
        assert run_killed([*COLLECT, "--out", str(out)], out / "problems.jsonl", at)
        half_written(out / "states.jsonl")
        half_written(out / "problems.jsonl")
    resumed = subprocess.run([*COLLECT, "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    for name in ("states.jsonl", "problems.jsonl"):
        assert sorted((out / name).read_text().splitlines()) == sorted((tmp_path / "whole" / name).read_text().splitlines())
