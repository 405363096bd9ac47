"""Headroom of a pair on the general training mix's short-answer families: each model alone
(target-only, draft-only) on one split of every family, each problem in the format it was drawn in
(raw, "Question: ...\\nAnswer:", or the chat template: the target's for the target, the draft's own
for a draft of another vocabulary), greedy, scored on the reply's first line. Per family and per
format: both accuracies, their union, and the problems only the draft / only the target solves:
what an arbiter can gain by keeping the draft's tokens, and what it must not lose where the target
is the stronger model.

    python bench/mix_headroom.py -m gemma3-270m -md smollm2-135m --split dev --limit 45 \\
        --eval-args "--chat-template gemma" --out bench/mix_headroom/gemma3-smollm2-dev

(Gemma 3 270M's file carries no chat template: llama.cpp and this engine fall back to ChatML, which
the model never saw; `--chat-template gemma` gives it its own turn format.)

Each family is one `cospec-local eval` folder under --out (resumable: run it again and it goes on).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from headroom import run_checked  # noqa: E402
from results_report import command, report  # noqa: E402


def run_eval(model: str, draft: str, family: str, split: str, limit: int, n: int, threads: int, out: Path,
             extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "cospec_local.cli", "eval", "-m", model, "-md", draft, "-t", str(threads), "-c", "1024",
           "--task", family, "--split", split, "--limit", str(limit), "--runs", "target-only,draft-only",
           "-n", str(n), "--out", str(out), "--json", *extra]
    return json.loads(run_checked(cmd))


def tally(records: list[dict], formats: dict[str, str]) -> dict:
    """Per format (and "all"): problems, target-only and draft-only successes, only-draft, only-target."""
    by_problem: dict[str, dict[str, bool]] = defaultdict(dict)
    for r in records:
        by_problem[r["problem_id"]][r["run"]] = bool(r["correct"])
    out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for pid, runs in by_problem.items():
        if len(runs) < 2:
            continue
        t, d = runs["target-only"], runs["draft-only"]
        for key in ("all", formats[pid]):
            row = out[key]
            row["problems"] += 1
            row["target"] += t
            row["draft"] += d
            row["only_draft"] += d and not t
            row["only_target"] += t and not d
    return {k: dict(v) for k, v in out.items()}


def main(argv=None) -> int:
    from cospec_local.tasks import SHORT_ANSWER_FAMILIES, load_task

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-md", "--model-draft", required=True)
    ap.add_argument("--split", default="dev", choices=("train", "dev", "test"))
    ap.add_argument("--limit", type=int, default=45, help="problems per family (fewer where its split holds fewer)")
    ap.add_argument("--families", default=",".join(f.name for f in SHORT_ANSWER_FAMILIES))
    ap.add_argument("-n", type=int, default=24)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--eval-args", default="", help="more `eval` options (a base model's --chat-template, say)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    started = time.time()
    rows, summary, loads = [], {}, []
    for family in a.families.split(","):
        folder = a.out / family
        s = run_eval(a.model, a.model_draft, family, a.split, a.limit, a.n, a.threads, folder, a.eval_args.split())
        loads.append(s.get("other_load") or 0.0)
        formats = {p.id: p.meta.get("format", "raw") for p in load_task(family, a.split, a.limit)}
        records = [json.loads(line) for line in (folder / "records.jsonl").read_text().splitlines() if line.strip()]
        counts = tally(records, formats)
        summary[family] = counts
        for key in ("all", "raw", "qa", "chat"):
            c = counts.get(key)
            if not c:
                continue
            n = c["problems"]
            rows.append(f"| {family} | {key} | {n} | {c['target'] / n:.1%} | {c['draft'] / n:.1%} | "
                        f"{(c['target'] + c['only_draft']) / n:.1%} | {c['only_draft']} | {c['only_target']} |")
            print(rows[-1], flush=True)
    total = defaultdict(int)
    for counts in summary.values():
        for k, v in counts["all"].items():
            total[k] += v
    cmd = command("mix_headroom.py", argv)
    lines = [f"# Headroom on the general mix: {a.model} <- {a.model_draft}", "", f"`{' '.join(cmd)}`", "",
             f"Each model alone, greedy, {a.n} tokens, the `{a.split}` split (at most {a.limit} problems a family), "
             "each problem in its drawn format. Scored on the reply's first line. Only the draft: what an arbiter "
             "keeping the draft's tokens can gain; only the target: what it can lose.", "",
             "| family | format | problems | target-only | draft-only | union | only the draft | only the target |",
             "|---|---|---|---|---|---|---|---|", *rows, "",
             f"All families: {total['problems']} problems; target-only {total['target'] / max(1, total['problems']):.1%}, "
             f"draft-only {total['draft'] / max(1, total['problems']):.1%}, only the draft {total['only_draft']}, "
             f"only the target {total['only_target']}."]
    report(lines, cmd, a.out, max(loads) if loads else 0.0, summary=summary, total=dict(total),
           seconds=time.time() - started, at=time.strftime("%Y-%m-%d"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
