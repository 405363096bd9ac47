"""Headroom of a draft from another family: Gemma 3 270M (a base model) and SmolLM2-135M-Instruct,
each alone on four kinds of short question (bench/headroom/tasks, written by
bench/headroom/make_tasks.py), each reading them in its own format: SmolLM2 through its chat
template, Gemma 3 through a question/answer template (cospec_local/data/gemma3-smollm2/qa.jinja: a base model answers
"Question: ...\\nAnswer:" and not its turn markers). Greedy, 24 tokens, scored on the reply's
first line. Per task and direction: target-only, draft-only, their union, the problems only the
draft solves (what an arbiter can collect) and those only the target solves, with 95% intervals.

    python bench/headroom.py --out bench/headroom/results

Each task and direction is one `cospec-local eval` folder under --out (resumable: run it again
after an interruption and it goes on).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from results_report import command, report  # noqa: E402

HERE = REPO / "bench" / "headroom"
# Gemma 3 270M is a base model: it answers "Question: ...\nAnswer:", not turn markers.
QA_TEMPLATE = REPO / "cospec_local" / "data" / "gemma3-smollm2" / "qa.jinja"
TASKS = ("capitals", "arithmetic", "antonyms", "plurals")
# label: (target, draft, the options that give each model its format)
DIRECTIONS = {
    "gemma3-270m <- smollm2-135m": ("gemma3-270m", "smollm2-135m", ["--chat-template-file", str(QA_TEMPLATE)]),
    "smollm2-135m <- gemma3-270m": ("smollm2-135m", "gemma3-270m",
                                    ["--chat-template-draft-file", str(QA_TEMPLATE)]),
}
BAR_POINTS = 3.0  # headroom (draft-only successes the target misses, in points) worth training an arbiter for


def folder(out: Path, label: str, task: str) -> Path:
    return out / label.replace(" <- ", "-from-") / task


def run_checked(cmd: list[str]) -> str:
    """A measuring step in its own process; its standard output, or the end of its error."""
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    return done.stdout


def eval_direction(label: str, task_file: Path, runs: str, out: Path, n: int, threads: int, limit: int | None,
                   *options: str) -> dict:
    """`cospec-local eval` of one direction's pair on a task file, each model in its own format;
    its summary (resumable in `out`)."""
    target, draft, format_options = DIRECTIONS[label]
    cmd = [sys.executable, "-m", "cospec_local.cli", "eval", "-m", target, "-md", draft, "-t", str(threads),
           "-c", "1024", *format_options, "--chat", "--task", str(task_file), "--runs", runs, "-n", str(n),
           "--out", str(out), "--json", *options]
    if limit is not None:
        cmd += ["--limit", str(limit)]
    return json.loads(run_checked(cmd))


def run_eval(out: Path, label: str, task: str, split: str, n: int, threads: int, limit: int | None) -> dict:
    return eval_direction(label, HERE / "tasks" / f"{task}-{split}.jsonl", "target-only,draft-only",
                          folder(out, label, task), n, threads, limit)


def swapped(summary: dict) -> dict:
    """An eval summary of target-only and draft-only with the two models' roles exchanged."""
    t, d = summary["runs"]["target-only"], summary["runs"]["draft-only"]
    only_target = d["losses"]  # the problems the target alone solves: the other way round, the draft's
    runs = {"target-only": {**d, "speedup": 1.0, "losses": 0},
            "draft-only": {**t, "speedup": 1.0 / d["speedup"] if d["speedup"] else None, "losses": summary["non_nested"]}}
    return {**summary, "runs": runs, "non_nested": only_target}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--split", default="test", choices=("test", "train"))
    ap.add_argument("-n", type=int, default=24)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--limit", type=int, default=None, help="problems per task (default: all)")
    ap.add_argument("--tasks", default=",".join(TASKS))
    a = ap.parse_args(argv)
    rows, summary, loads = [], {}, []
    measured: dict[tuple[str, str, str], dict] = {}
    for label in DIRECTIONS:
        target_name, draft_name, _ = DIRECTIONS[label]
        for task in a.tasks.split(","):
            # Each model alone writes the same tokens in either role (its own format either way): the
            # other direction is the same two runs, read the other way round.
            other = measured.get((draft_name, target_name, task))
            s = swapped(other) if other is not None else run_eval(a.out, label, task, a.split, a.n, a.threads, a.limit)
            measured[(target_name, draft_name, task)] = s
            t, d = s["runs"]["target-only"], s["runs"]["draft-only"]
            n = s["problems"]
            only_draft = s["non_nested"]
            only_target = d["losses"]  # the target's successes the draft misses
            headroom = 100.0 * only_draft / n
            summary[f"{label}: {task}"] = {"problems": n, "target": t["accuracy"], "target_ci95": t["accuracy_ci95"],
                                           "draft": d["accuracy"], "draft_ci95": d["accuracy_ci95"],
                                           "union": s["oracle_union"], "only_draft": only_draft,
                                           "only_target": only_target, "headroom_points": headroom,
                                           "draft_speed_over_target": d["speedup"]}
            loads.append(s.get("other_load") or 0.0)
            rows.append(f"| {label} | {task} | {n} | {t['accuracy']:.1%} ({t['accuracy_ci95'][0]:.0%}-"
                        f"{t['accuracy_ci95'][1]:.0%}) | {d['accuracy']:.1%} ({d['accuracy_ci95'][0]:.0%}-"
                        f"{d['accuracy_ci95'][1]:.0%}) | {s['oracle_union']:.1%} | {only_draft} | {only_target} | "
                        f"{headroom:+.1f} | {'yes' if headroom >= BAR_POINTS else 'no'} |")
            print(rows[-1], flush=True)
    cmd = command("headroom.py", argv)
    lines = ["# Headroom of a draft from another family", "", f"`{' '.join(cmd)}`", "",
             f"Each model alone, greedy, {a.n} tokens, the `{a.split}` split of each task; SmolLM2 through its chat "
             "template, Gemma 3 270M (a base model) through cospec_local/data/gemma3-smollm2/qa.jinja. Scored on the reply's first line. "
             "Headroom: the problems only the draft solves, in points of the task: what an arbiter that keeps the "
             f"draft's tokens can collect (an arbiter is worth training from {BAR_POINTS:g} points). Each model alone "
             "writes the same tokens in either role, so the second direction reads the first's runs the other way "
             "round (one eval folder per task).", "",
             "| target <- draft | task | problems | target-only (95% CI) | draft-only (95% CI) | union | only the draft "
             "| only the target | headroom (points) | train an arbiter |", "|---|---|---|---|---|---|---|---|---|---|",
             *rows]
    report(lines, cmd, a.out, max(loads) if loads else 0.0, summary=summary, at=time.strftime("%Y-%m-%d"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
