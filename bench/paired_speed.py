"""Speed of runs against a baseline run, repeated over the same problems, so that a difference
of 1-2% can be told from this machine's noise (one `eval` run moves identical configurations by
up to 5%, and between runs by 6 points: bench/RESULTS.md).

Every problem runs with every run back to back, in an order that rotates with the problem and
the repeat, so that no run always comes first, right after another problem's runs. Reported per
run, against the first of --runs:
- the tokens/s ratio of each repeat, their mean, lowest and highest;
- the pooled ratio over all repeats with a 95% bootstrap interval over problems;
- the same over each problem's median time across the repeats, which leaves out the machine's
  stalls (one problem taking 10-100x its usual time in one repeat);
- whether every repeat produced the same tokens (they must: runs do not depend on timing).

    python bench/paired_speed.py --task arith --limit 500 --repeats 5 --runs sps,cospec:demo-lora -t 2 --out OUT
    python bench/paired_speed.py --records OUT/records.jsonl --runs sps,cospec:demo-lora   # summarize it again

A run may carry its own longest block, after a slash (`sps/16`); the others draft up to
--draft-max tokens a block:

    python bench/paired_speed.py --task arith --runs sps,sps/16,cospec:demo-lora/16 -t 2 --out OUT
"""
from __future__ import annotations

import argparse
import json
import random
import re
import statistics
from dataclasses import asdict, replace
from pathlib import Path

from cospec_local import Engine, GenerationParams
from cospec_local.evaluation.task_eval import rotated, run_problem
from cospec_local.evaluation.runs import parse_runs
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
    ap.add_argument("--draft-max", type=int, default=GenerationParams().draft_max,
                    help="longest block (K) of the runs that name none after a slash")
    ap.add_argument("--out", type=Path, help="folder for records.jsonl and results.json")
    ap.add_argument("--records", type=Path, help="summarize this records.jsonl of an earlier run instead of running")
    args = ap.parse_args()
    if (args.out is None) == (args.records is None):
        ap.error("give --out (run) or --records (summarize a run)")

    if args.records is not None:  # summarize a finished run again
        records = [json.loads(line) for line in args.records.read_text(encoding="utf-8").splitlines()]
        summarize(records, args.runs.split(","), args)
        return

    engine = Engine.open_default(n_ctx=4096, n_threads=args.threads)
    runs, params = runs_with_lengths(args.runs, engine.draft_path,
                                     GenerationParams(max_tokens=256, draft_max=args.draft_max))
    labels = [r.label for r in runs]
    problems = load_task(args.task, args.split, args.limit)
    args.out.mkdir(parents=True, exist_ok=True)
    records = []
    with engine, (args.out / "records.jsonl").open("w", encoding="utf-8") as log:
        for rep in range(args.repeats):
            for i, problem in enumerate(problems):
                for run in rotated(runs, rep + i):
                    rec = {"repeat": rep, **asdict(run_problem(engine, problem, run, params[run.label], score,
                                                               as_chat=False))}
                    log.write(json.dumps(rec) + "\n")
                    records.append(rec)
            done = [r for r in records if r["repeat"] == rep]
            print(f"repeat {rep}: " + ", ".join(
                f"{label} {tokens_per_s([r for r in done if r['run'] == label]):.0f} tok/s" for label in labels),
                flush=True)
    summary = summarize(records, labels, args)
    (args.out / "results.json").write_text(json.dumps(summary, indent=1))


def runs_with_lengths(text: str, draft_path, params: GenerationParams):
    """The runs of --runs and each one's settings: `RUN/K` is RUN drafting blocks of up to K."""
    runs, settings = [], {}
    for item in (part.strip() for part in text.split(",") if part.strip()):
        m = re.fullmatch(r"(.+)/(\d+)", item)
        runs.append(replace(parse_runs(m.group(1) if m else item, draft_path)[0], label=item))
        settings[item] = params.updated(draft_max=int(m.group(2))) if m else params
    if len(settings) != len(runs):
        raise SystemExit("--runs: a run is named twice")
    return runs, settings


def tokens_per_s(records: list[dict]) -> float:
    return 1000 * sum(r["tokens"] for r in records) / sum(r["ms"] for r in records)


def summarize(records: list[dict], labels: list[str], args) -> dict:
    """Ratios against the first run; printed, and returned for results.json."""
    base = labels[0]
    repeats = sorted({r["repeat"] for r in records})
    ids = sorted({r["problem_id"] for r in records})
    by = {(r["repeat"], r["problem_id"], r["run"]): r for r in records}
    same = all(by[rep, i, label]["completion"] == by[repeats[0], i, label]["completion"]
               for rep in repeats for i in ids for label in labels)
    # Pooled: every repeat's time summed. Of medians: each problem's median time over the repeats,
    # so that a stall of the machine (a problem that took 10-100x its usual time in one repeat) is
    # left out.
    pooled_times, median_times = {}, {}
    for i in ids:
        for label in labels:
            rows = [by[rep, i, label] for rep in repeats]
            pooled_times[i, label] = [sum(r["tokens"] for r in rows), sum(r["ms"] for r in rows)]
            median_times[i, label] = [rows[0]["tokens"], statistics.median(r["ms"] for r in rows)]
    summary = {"task": args.task, "split": args.split, "problems": len(ids), "repeats": len(repeats),
               "threads": args.threads, "baseline": base, "same_tokens_every_repeat": same, "runs": {}}
    for label in labels[1:]:
        ratios = [tokens_per_s([by[rep, i, label] for i in ids]) / tokens_per_s([by[rep, i, base] for i in ids])
                  for rep in repeats]
        pooled, lo, hi = bootstrap_ratio(pooled_times, ids, label, base)
        of_medians, m_lo, m_hi = bootstrap_ratio(median_times, ids, label, base)
        summary["runs"][label] = {"ratio_per_repeat": [round(r, 4) for r in ratios],
                                  "mean": sum(ratios) / len(ratios), "lowest": min(ratios), "highest": max(ratios),
                                  "pooled": pooled, "pooled_ci95": [lo, hi],
                                  "of_medians": of_medians, "of_medians_ci95": [m_lo, m_hi]}
        print(f"{label} / {base}: repeats {', '.join(f'{r:.3f}' for r in ratios)}; mean {sum(ratios) / len(ratios):.3f}"
              f"; pooled {pooled:.3f} (95% over problems {lo:.3f}-{hi:.3f})"
              f"; of each problem's median time {of_medians:.3f} ({m_lo:.3f}-{m_hi:.3f})")
    print(f"same tokens in every repeat: {same}")
    return summary


if __name__ == "__main__":
    main()
