"""Where a speculative block's time goes, adaptive lengths against fixed K, on one task family.

    python bench/experiments/block_costs.py --task pyfunc --limit 150 --repeat 2 -t 2

Runs target-only, sps (adaptive, K = 8, K = 5) and demo-lora (adaptive, K = 8) on the demo pair,
interleaved problem by problem, and prints each run's speed against target-only and, per block in
target steps, the time inside the draft's and the target's llama_decode calls, sampling, and the
rest.

Run 2026-12-02 (bench/RESULTS.md, "Block lengths that stick").
Kept as the record of that measurement, frozen: it is not maintained or tested and may not run
against today's code.
"""
from __future__ import annotations

import argparse
import collections

from cospec_local import Engine
from cospec_local.tasks import FAMILY_STOPS, load_task

RUNS = [("target-only", dict(mode="target-only")),
        ("sps adaptive", dict(arbiter="target", adaptive_draft=True, draft_max=8)),
        ("sps K=8", dict(arbiter="target", adaptive_draft=False, draft_max=8)),
        ("sps K=5", dict(arbiter="target", adaptive_draft=False, draft_max=5)),
        ("lora adaptive", dict(arbiter="demo-lora", adaptive_draft=True, draft_max=8)),
        ("lora K=8", dict(arbiter="demo-lora", adaptive_draft=False, draft_max=8))]
STATS = ("predicted_ms", "draft_ms", "verify_ms", "sample_ms", "blocks", "plain", "predicted_n", "draft_n",
         "draft_n_accepted")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", default="pyfunc")
    ap.add_argument("--limit", type=int, default=150, help="Test problems.")
    ap.add_argument("--repeat", type=int, default=2, help="Passes over the problems.")
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()
    engine = Engine.open_default(n_threads=args.threads)
    problems = load_task(args.task, "test", args.limit)
    totals = {name: collections.Counter() for name, _ in RUNS}
    for _ in range(args.repeat):
        for problem in problems:
            for name, settings in RUNS:
                stats = engine.generate(problem.prompt, max_tokens=256, stop=tuple(FAMILY_STOPS.get(args.task, ())),
                                        **settings).stats
                for key in STATS:
                    totals[name][key] += getattr(stats, key)
    step = totals["target-only"]["predicted_ms"] / totals["target-only"]["predicted_n"]
    print(f"{args.task}, {len(problems)} test problems x {args.repeat}; a target step: {step:.3f} ms")
    print("| run | speed-up | blocks | plain steps | drafted / block | reached the output / block "
          "| per block, in target steps: draft | verify | sampling | rest |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, t in totals.items():
        if name == "target-only":
            continue
        blocks = max(1, t["blocks"])
        rest = t["predicted_ms"] - t["draft_ms"] - t["verify_ms"] - t["sample_ms"]
        per_block = [x / blocks / step for x in (t["draft_ms"], t["verify_ms"], t["sample_ms"], rest)]
        print(f"| {name} | {step / (t['predicted_ms'] / t['predicted_n']):.3f}x | {t['blocks']} | {t['plain']} "
              f"| {t['draft_n'] / blocks:.2f} | {t['draft_n_accepted'] / blocks:.2f} | "
              + " | ".join(f"{x:.2f}" for x in per_block) + " |")


if __name__ == "__main__":
    main()
