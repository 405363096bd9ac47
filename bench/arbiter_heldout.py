"""Accuracy of learned arbiters on held-out problems: the dev problems past those that data
collection and the warm-up's threshold choice use (arith dev 600-1599, pyfunc dev 600-919 by
default), greedy, each arbiter deciding by its own threshold or the one after `@`.

    python bench/arbiter_heldout.py demo-lora runs/arbiters-r2/lora runs/arbiters-r2/lora@0.7

Only problems whose plain speculative run reaches a mismatch are regenerated (an arbiter has no
decision to make in the others, which keep the target's answer); that screen is cached in --cache.
Prints accuracy against target-only, and the problems recovered (the target wrong, the arbiter
right) and lost (the reverse). It measures accuracy only (no timing, so machine load does not
matter); `cospec-local eval` measures speed.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from cospec_local.arbiter.catalog import resolve_arbiter_path
from cospec_local.evaluation.task_eval import model_identity
from cospec_local.models import resolve_model
from cospec_local.tasks import load_task
from cospec_local.train.rollout import GreedyTask, RolloutPool, ScreenTask, Screening, WorkerConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("arbiters", nargs="+", help="named arbiter or folder, optionally @THRESHOLD")
    ap.add_argument("--ranges", default="arith:600:1600,pyfunc:600:920",
                    help="family:first:end of the dev split, comma-separated")
    ap.add_argument("-m", "--model", default="demo-target", help="target (named model or GGUF)")
    ap.add_argument("-md", "--model-draft", default="demo-draft", help="draft the arbiters were trained for")
    ap.add_argument("-n", "--max-tokens", type=int, default=256, help="most tokens per answer")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cache", type=Path, default=None, help="JSON file for the screen of these problems")
    args = ap.parse_args()
    problems = {}
    for item in args.ranges.split(","):
        family, first, end = item.split(":")
        problems[family] = load_task(family, "dev", int(end))[int(first):]
    every = [p for ps in problems.values() for p in ps]
    target, draft = resolve_model(args.model), resolve_model(args.model_draft)
    wcfg = WorkerConfig(str(target), str(draft), 1, args.max_tokens)
    key = {"models": [model_identity(target), model_identity(draft)], "max_tokens": args.max_tokens,
           "problems": [p.id for p in every]}
    with RolloutPool(wcfg, args.workers) as pool:
        cached = json.loads(args.cache.read_text()) if args.cache and args.cache.is_file() else {}
        if cached.get("key") == key:
            screen = {i: Screening(**s) for i, s in cached["screen"].items()}
        else:
            screen = {s.problem_id: s for s in pool.map(ScreenTask(p) for p in every)}
            if args.cache:
                args.cache.write_text(json.dumps({"key": key, "screen": {i: asdict(s) for i, s in screen.items()}}))
        for spec in args.arbiters:
            name, _, threshold = spec.partition("@")
            folder = str(resolve_arbiter_path(name))
            for family, ps in problems.items():
                todo = [p for p in ps if screen[p.id].mismatches > 0]
                runs = {r.problem_id: r for r in
                        pool.map(GreedyTask(p, folder, float(threshold) if threshold else None) for p in todo)}
                target = sum(screen[p.id].target_correct for p in ps)
                right = sum(runs[p.id].correct if p.id in runs else screen[p.id].target_correct for p in ps)
                recovered = sum(r.correct and not screen[i].target_correct for i, r in runs.items())
                lost = sum(screen[i].target_correct and not r.correct for i, r in runs.items())
                print(f"{spec:40s} {family:7s} problems {len(ps)}  target-only {100 * target / len(ps):.2f}%  "
                      f"arbiter {100 * right / len(ps):.2f}%  recovered {recovered}  lost {lost}  "
                      f"kept {sum(r.kept for r in runs.values())}", flush=True)


if __name__ == "__main__":
    main()
