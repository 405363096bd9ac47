"""Speed of runs against a baseline run, repeated over the same problems, so that a difference
of 1-2% can be told from this machine's noise (one `eval` run moves identical configurations by
up to 5%, and between runs by 6 points: bench/RESULTS.md).

Every problem runs with every run back to back, in an order that rotates with the problem and
the repeat, so that no run always comes first, right after another problem's runs. Reported per
run, against the first of --runs:
- the tokens/s ratio of each repeat, their mean, lowest and highest;
- the pooled ratio over all repeats with a 95% bootstrap interval over problems;
- whether every repeat produced the same tokens (they must: runs do not depend on timing).

    python bench/paired_speed.py --task arith --limit 500 --repeats 5 --runs sps,cospec:demo-lora -t 2 --out OUT
"""
from __future__ import annotations

import argparse
import json
import random
from dataclasses import asdict
from pathlib import Path

from cospec_local import Engine, GenerationParams
from cospec_local.evaluate import rotated, run_problem
from cospec_local.runs import parse_runs
from cospec_local.tasks import load_task, score


def bootstrap_ratio(per_problem: dict, ids: list, run: str, base: str, draws: int = 2000, seed: int = 0):
    """95% interval of pooled tok/s(run) / tok/s(base), resampling problems."""
    rng = random.Random(seed)

    def ratio(sample):
        tok_r = sum(per_problem[i, run][0] for i in sample)
        ms_r = sum(per_problem[i, run][1] for i in sample)
        tok_b = sum(per_problem[i, base][0] for i in sample)
        ms_b = sum(per_problem[i, base][1] for i in sample)
        return (tok_r / ms_r) / (tok_b / ms_b)

    values = sorted(ratio([rng.choice(ids) for _ in ids]) for _ in range(draws))
    return ratio(ids), values[int(0.025 * draws)], values[int(0.975 * draws) - 1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="arith")
    ap.add_argument("--split", default="test")
    ap.add_argument("--limit", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--runs", default="sps,cospec:demo-lora", help="the first is the baseline")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True, help="folder for records.jsonl and results.json")
    args = ap.parse_args()

    engine = Engine.open_default(n_ctx=4096, n_threads=args.threads)
    runs = parse_runs(args.runs, engine.draft_path)
    base = runs[0].label
    problems = load_task(args.task, args.split, args.limit)
    params = GenerationParams(max_tokens=256)
    args.out.mkdir(parents=True, exist_ok=True)
    tokens_of = {}  # (repeat, problem, run) -> completion, to check that repeats agree
    totals = {}  # (repeat, run) -> [tokens, ms]
    per_problem = {}  # (problem, run) -> [tokens, ms] over all repeats
    with engine, (args.out / "records.jsonl").open("w", encoding="utf-8") as log:
        for rep in range(args.repeats):
            for i, problem in enumerate(problems):
                for run in rotated(runs, rep + i):
                    rec = run_problem(engine, problem, run, params, score, as_chat=False)
                    log.write(json.dumps({"repeat": rep, **asdict(rec)}) + "\n")
                    tokens_of[rep, problem.id, run.label] = rec.completion
                    for key, table in (((rep, run.label), totals), ((problem.id, run.label), per_problem)):
                        t = table.setdefault(key, [0, 0.0])
                        t[0] += rec.tokens
                        t[1] += rec.ms
            print(f"repeat {rep}: " + ", ".join(
                f"{r.label} {1000 * totals[rep, r.label][0] / totals[rep, r.label][1]:.0f} tok/s" for r in runs),
                flush=True)
    ids = [p.id for p in problems]
    same = all(tokens_of[rep, i, r.label] == tokens_of[0, i, r.label]
               for rep in range(args.repeats) for i in ids for r in runs)
    summary = {"task": args.task, "split": args.split, "problems": len(ids), "repeats": args.repeats,
               "threads": args.threads, "baseline": base, "same_tokens_every_repeat": same, "runs": {}}
    for run in runs[1:]:
        ratios = [(totals[rep, run.label][0] / totals[rep, run.label][1]) / (totals[rep, base][0] / totals[rep, base][1])
                  for rep in range(args.repeats)]
        pooled, lo, hi = bootstrap_ratio(per_problem, ids, run.label, base)
        summary["runs"][run.label] = {"ratio_per_repeat": [round(r, 4) for r in ratios],
                                      "mean": sum(ratios) / len(ratios), "lowest": min(ratios), "highest": max(ratios),
                                      "pooled": pooled, "pooled_ci95": [lo, hi]}
        print(f"{run.label} / {base}: repeats {', '.join(f'{r:.3f}' for r in ratios)}; mean {sum(ratios) / len(ratios):.3f}"
              f"; pooled {pooled:.3f} (95% over problems {lo:.3f}-{hi:.3f})")
    print(f"same tokens in every repeat: {same}")
    (args.out / "results.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
