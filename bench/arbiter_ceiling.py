"""How much an arbiter could recover with one kept mismatch: the single-keep oracle.

For each problem, plain speculative decoding runs (the target's answer); at every block whose first
mismatch the walk reaches, the keep branch (that draft token, then speculative decoding to the end)
is scored, exactly as the warm-up's data collection does (`cospec_local.train.collect.Collector`).
A problem the target gets wrong is recoverable by one keep when some keep branch is right. An
oracle arbiter that keeps there and nowhere else loses nothing, so this bounds what one kept token
per answer can recover; answers that need two or more kept tokens are not searched.

    python bench/arbiter_ceiling.py --records bench/demo_pair_eval/arith/records.jsonl --family arith

With --arbiters, every state is also scored by each arbiter (from the generation's own callbacks,
while the draft's cache holds the block's context): their ranking of the decisive states (AUC) and
the one-keep policy (keep at the first state at or above the threshold, then never again), which
on arith gives the real runs' recoveries and losses. With --records (an eval's records.jsonl on
the same problems), the recoverable problems are set beside the runs there: the draft-only
successes the recovery bar counts, what each run recovered, and the best any threshold of the
one-keep policy does against that bar. Accuracy only (no timing).

    python bench/arbiter_ceiling.py --family arith --split dev --first 600 --limit 1600 --arbiters demo-lora demo-features
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from cospec_local.engine import Engine
from cospec_local.params import GenerationParams
from cospec_local.tasks import load_task
from cospec_local.train.collect import MAX_TOKENS, Collector
from cospec_local.train.states import TRAINING_SOURCES
from cospec_local.train.warmup import ranking_auc


def one_keep(rows: list[dict], name: str, threshold: float) -> tuple[set, set]:
    """Problems recovered and lost by the one-keep policy: keep at the first state whose P(keep)
    is at or above the threshold, then never again (its outcome is that state's keep branch)."""
    recovered, lost = set(), set()
    for r in rows:
        first = next((s for s in r["states"] if s["p_keep"][name] >= threshold), None)
        if first is not None and first["keep_correct"] != r["target_correct"]:
            (recovered if first["keep_correct"] else lost).add(r["problem_id"])
    return recovered, lost


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", default="arith")
    ap.add_argument("--split", default="test")
    ap.add_argument("--first", type=int, default=0, help="index of the first problem of the split")
    ap.add_argument("--limit", type=int, default=500, help="problems of the split up to this index")
    ap.add_argument("-m", "--model", default="demo-target")
    ap.add_argument("-md", "--model-draft", default="demo-draft")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--records", type=Path, default=None, help="an eval's records.jsonl on the same problems")
    ap.add_argument("--out", type=Path, default=None, help="write the per-problem oracle rows here (jsonl)")
    ap.add_argument("--states", type=Path, default=None,
                    help="write the decision states here too (jsonl, collect.py's format: for "
                         "bench/experiments/arbiter_backbone_probe.py --eval)")
    ap.add_argument("--arbiters", nargs="*", default=[],
                    help="learned arbiters to score every state with: their ranking of the states, and the one-keep "
                         "policy (keep at the first state at or above the threshold, then never again)")
    args = ap.parse_args()

    problems = load_task(args.family, args.split, args.limit)[args.first:]
    rows, all_states = [], []
    # Uncalibrated: the states and rows are compared with recorded evaluations that ran without one,
    # and a greedy collection's block lengths would otherwise start from this machine's calibration.
    with Engine(args.model, args.model_draft, n_ctx=1024, n_threads=args.threads, calibration=None) as engine:
        arbiters = {name: engine.arbiter(name) for name in args.arbiters}
        scored: dict[tuple, dict] = {}

        def observe(block):  # score every block of the recorded run while the draft's cache holds its context
            key = (tuple(block["context"].tolist()), tuple(block["draft"].tolist()))
            scored[key] = {name: a.score(block) for name, a in arbiters.items()}

        collector = Collector(engine, GenerationParams(max_tokens=MAX_TOKENS, spec_type=TRAINING_SOURCES), observe=observe)
        for p in problems:
            scored.clear()
            summary, states = collector.problem(p, args.split)
            all_states += states
            seq = []
            for s in states:
                by_arbiter = scored[(tuple(s.state.context), tuple(s.state.draft))]
                seq.append({"keep_correct": s.keep_correct,
                            "p_keep": {name: float(v[s.position]) for name, v in by_arbiter.items()}})
            rows.append({"problem_id": p.id, "target_correct": summary["correct"], "states": seq})
        thresholds = {name: a.threshold for name, a in arbiters.items()}
    if args.states:
        args.states.write_text("".join(json.dumps(s.to_json()) + "\n" for s in all_states))
    if args.out:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))

    wrong = [r for r in rows if not r["target_correct"]]
    recoverable = {r["problem_id"] for r in wrong if any(s["keep_correct"] for s in r["states"])}
    right = [r for r in rows if r["target_correct"]]
    fragile = sum(1 for r in right if any(not s["keep_correct"] for s in r["states"]))
    n_states = sum(len(r["states"]) for r in rows)
    print(f"{args.family} {args.split}[{args.first}:{args.limit}]: target right {len(right)}, wrong {len(wrong)}; "
          f"recoverable by one keep {len(recoverable)} (oracle accuracy {(len(right) + len(recoverable)) / len(rows):.1%}); "
          f"target-right problems that some keep loses {fragile}; states {n_states}")

    # Each arbiter on these states. Decisive: keeping and rejecting end differently.
    for name in args.arbiters:
        decisive = [(s["p_keep"][name], int(s["keep_correct"])) for r in rows for s in r["states"]
                    if s["keep_correct"] != r["target_correct"]]
        probs, labels = [p for p, _ in decisive], [y for _, y in decisive]
        n_keep_better = sum(labels)
        auc = ranking_auc(probs, labels)
        recovered, lost = one_keep(rows, name, thresholds[name])
        print(f"{name} (threshold {thresholds[name]:.3f}): {n_keep_better} keep-better and {len(labels) - n_keep_better} reject-better "
              f"states, AUC {auc:.3f}; keeping once at the threshold recovers {len(recovered)} and loses {len(lost)} "
              f"(accuracy {(len(right) + len(recovered) - len(lost)) / len(rows):.1%})")

    if args.records:
        correct = defaultdict(dict)
        for line in args.records.read_text().splitlines():
            rec = json.loads(line)
            correct[rec["run"]][rec["problem_id"]] = rec["correct"]
        ids = [r["problem_id"] for r in rows]
        target = {r["problem_id"]: r["target_correct"] for r in rows}
        if "target-only" in correct:
            differ = sum(1 for i in ids if correct["target-only"].get(i) != target[i])
            print(f"target-only in the records differs from this run's target on {differ} problems")
        draft_only = {i for i in ids if correct.get("draft-only", {}).get(i) and not target[i]}
        print(f"draft-only successes (the bar's denominator): {len(draft_only)}; of them recoverable by one keep: "
              f"{len(draft_only & recoverable)}; recoverable that the draft alone gets wrong: "
              f"{len(recoverable - draft_only)}")
        for run, by_id in correct.items():
            if not run.startswith(("cospec", "fly")):
                continue
            recovered = {i for i in ids if by_id.get(i) and not target[i]}
            lost = sum(1 for i in ids if target[i] and by_id.get(i) is False)
            print(f"  {run}: recovered {len(recovered)} (of the draft-only ones {len(recovered & draft_only)}; "
                  f"recoverable by one keep {len(recovered & recoverable)}), lost {lost}")
        # The recovery bar: at least half the draft-only successes, losses at most a third of that.
        for name in args.arbiters:
            points = []
            for tau in sorted({s["p_keep"][name] for r in rows for s in r["states"]}):
                recovered, lost = one_keep(rows, name, tau)
                points.append((len(recovered & draft_only), len(lost), tau))
            half = (len(draft_only) + 1) // 2
            precise = max((p for p in points if 3 * p[1] <= p[0]), default=(0, 0, 1.0))
            enough = min((p for p in points if p[0] >= half), key=lambda p: p[1], default=None)
            print(f"  {name}, keeping once, any threshold: with losses <= a third of recoveries at most "
                  f"{precise[0]} draft-only recovered ({precise[1]} lost, at {precise[2]:.3f}); "
                  + (f"{half} recovered cost at least {enough[1]} lost (at {enough[2]:.3f})" if enough else
                     f"never {half} recovered"))


if __name__ == "__main__":
    main()
