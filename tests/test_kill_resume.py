"""Long jobs killed with SIGKILL at points chosen by seed, then rerun: the result equals an
uninterrupted run's, and a half-written last line (a kill in the middle of a write) is never read
as data. Jobs: `cospec-local eval --out` (records.jsonl), decision-state collection
(states.jsonl, problems.jsonl), GRPO training (checkpoint.pt, log.jsonl, best/) and the whole
`cospec-local arbiter train` recipe (its stages, the warm-up's checkpoints-free restart, the
installed arbiter)."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

from cospec_local.arbiter.catalog import NAMED_ARBITERS

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


# ---------------------------------------------------------------- training jobs

GRPO = [sys.executable, "-m", "cospec_local.train.grpo", "--init", str(NAMED_ARBITERS["demo-features"].path),
        "--pool", "30", "--dev", "8", "--prompts-per-step", "4", "--group-size", "4", "--eval-every", "1",
        "--threads", "1", "--sweep", "0.5,0.9", "--steps", "3"]


def tensors(path: Path) -> dict:
    return {t.name: np.array(t.data) for t in GGUFReader(str(path)).tensors}


def same_tensors(a: Path, b: Path) -> bool:
    ta, tb = tensors(a), tensors(b)
    return ta.keys() == tb.keys() and all(np.array_equal(ta[k], tb[k]) for k in ta)


def without_times(record: dict) -> dict:
    return {k: v for k, v in record.items() if not (k.endswith("_s") or k in ("seconds", "elapsed"))}


@pytest.mark.slow
def test_grpo_killed_at_random_points_resumes_to_the_same_run(tmp_path):
    """Killed after 1, 2 or 3 logged records (seeded), resumed from checkpoint.pt: the same log
    (times aside) and the same best arbiter as a run never stopped. log.jsonl gets a line per
    step, and the checkpoint is written after it: a kill between the two redoes the step, and the
    log is rewritten from the checkpoint."""
    whole, resumed = whole_then_killed_then_resumed(GRPO, tmp_path, 7, 4, "log.jsonl", ("log.jsonl",), 900)

    def log(folder: Path) -> list[dict]:
        return [without_times(json.loads(line)) for line in (folder / "log.jsonl").read_text().splitlines()]

    killed, uninterrupted = tmp_path / "killed", tmp_path / "whole"
    assert [r["step"] for r in log(killed)] == [0, 1, 2, 3] and log(killed) == log(uninterrupted)
    assert same_tensors(killed / "best" / "arbiter.gguf", uninterrupted / "best" / "arbiter.gguf")
    assert json.loads((killed / "summary.json").read_text())["best"] == \
        json.loads((uninterrupted / "summary.json").read_text())["best"]


RECIPE = [sys.executable, "-m", "cospec_local.cli", "arbiter", "train", "mine", "--task", "arith", "--train", "120",
          "--dev", "30", "--test", "30", "--kinds", "features,lora", "-t", "2", "--force"]


def run_recipe(work: Path, arbiters: Path, kill_after: float | None = None) -> subprocess.CompletedProcess | None:
    """`arbiter train` into `work`; with kill_after, the whole process group (the recipe and the
    stage it runs) is SIGKILLed that many seconds in, as a crash would end both. None: killed."""
    env = {**os.environ, "COSPEC_LOCAL_ARBITERS": str(arbiters)}
    proc = subprocess.Popen([*RECIPE, "--work", str(work)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=kill_after if kill_after is not None else 900)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None


@pytest.mark.slow
def test_arbiter_train_killed_at_random_points_resumes_to_the_same_arbiter(tmp_path):
    """The recipe SIGKILLed at three seeded moments of an uninterrupted run's length (any stage:
    headroom, collection, warm-up, evaluation, install), then rerun: the same installed arbiter
    (tensors, threshold, held-out evaluation) as the run never stopped."""
    start = time.monotonic()
    whole = run_recipe(tmp_path / "whole-work", tmp_path / "whole")
    length = time.monotonic() - start
    assert whole is not None and whole.returncode == 0, whole.stderr[-3000:]
    work, installed = tmp_path / "killed-work", tmp_path / "killed"
    kills = 0
    for fraction in sorted(random.Random(37).sample(range(5, 95), KILL_POINTS)):
        kills += run_recipe(work, installed, kill_after=length * fraction / 100) is None
    assert kills >= 1  # at least one kill landed before the run could finish on its own
    resumed = run_recipe(work, installed)
    assert resumed is not None and resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = tmp_path / "whole" / "mine", installed / "mine"
    record_a, record_b = (json.loads((f / "evaluation.json").read_text()) for f in (a, b))
    assert record_a["kind"] == record_b["kind"]
    for name in ("arbiter.gguf", "adapter.gguf"):
        assert (a / name).is_file() == (b / name).is_file()
        if (a / name).is_file():
            assert same_tensors(a / name, b / name), name
    info_a, info_b = (json.loads((f / "info.json").read_text()) for f in (a, b))
    assert info_a["threshold"] == info_b["threshold"]
    strip = ("predicted_per_second", "speedup", "arbiter_share")
    rows = [{task: {run: {k: v for k, v in row.items() if k not in strip} for run, row in r["runs"].items()}
             for task, r in rec["evaluation"].items()} for rec in (record_a, record_b)]
    assert rows[0] == rows[1]



def processes_in_group(pgid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid:
                    found.append(int(entry.name))
            except ProcessLookupError:
                pass
    return found


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="children follow a killed parent on Linux only")
def test_a_killed_policy_collection_takes_its_engine_workers_with_it(tmp_path):
    """SIGKILL to the collection alone (not its group): its rollout workers, one engine each, end
    too instead of living on as orphans."""
    command = [*COLLECT, "--out", str(tmp_path / "policy"), "--policy", "demo-features", "--workers", "2",
               "--threads", "2"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while len(processes_in_group(proc.pid)) < 3 and time.monotonic() < deadline:  # the collection and 2 workers
            time.sleep(0.05)
        assert len(processes_in_group(proc.pid)) >= 3
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 30
        while processes_in_group(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert processes_in_group(proc.pid) == []
    finally:
        for pid in processes_in_group(proc.pid):
            os.kill(pid, signal.SIGKILL)
