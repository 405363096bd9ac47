"""A learned arbiter for a draft of another family, against the bars it must clear: on each task's
`test` split (bench/headroom/tasks, which `arbiter train` never reads: it trains on the `train`
files), target-only, draft-only, their union, sps (lossless speculation), FLy (training-free) and
CoSpec with the arbiter, with 95% intervals, recovered and lost problems and tokens/s; then general
chat: the share of greedy replies to held-out chat prompts identical to target-only.

    python bench/cross_vocab_arbiter.py --arbiter gemma3-smollm2-words --out bench/cross_vocab_arbiter/gemma3-smollm2-words

The bars, never retuned: accuracy >= target-only + 3 points; >= 50% of the draft-only successes
recovered; losses <= 1/3 of recoveries; tokens/s >= 0.97x sps; general chat >= 95% identical.
An arbiter ships (a named arbiter) only where it beats target-only by more than the intervals.
Each task is one `cospec-local eval` folder under --out (resumable).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from headroom import DIRECTIONS, HERE, eval_direction, run_checked  # noqa: E402
from results_report import command, report  # noqa: E402

BARS = {"points": 3.0, "recovered_share": 0.5, "losses_per_recovery": 1 / 3, "speed_over_sps": 0.97,
        "chat_identical": 0.95}


def run_eval(out: Path, label: str, task: str, arbiter: str, n: int, threads: int, limit: int | None,
             ngram: bool = False) -> dict:
    """The task's eval; ngram: CoSpec alone with n-gram blocks too (`--spec-type ngram,draft`: the
    arbiter decides the draft model's blocks, n-gram blocks stay lossless)."""
    runs = f"cospec:{arbiter}" if ngram else f"target-only,draft-only,sps,fly,cospec:{arbiter}"
    return eval_direction(label, HERE / "tasks" / f"{task}-test.jsonl", runs, out / (f"{task}-ngram" if ngram else task),
                          n, threads, limit, *(["--spec-type", "ngram,draft"] if ngram else []))


def chat_identity(out: Path, label: str, arbiter: str, prompts: int, threads: int) -> dict:
    """bench/chat_identity.py in its own process, each model in its own format."""
    target, draft, format_options = DIRECTIONS[label]
    file = out / "chat_identity.json"
    if not file.exists():
        run_checked([sys.executable, str(REPO / "bench" / "chat_identity.py"), "-m", target, "-md", draft, "--arbiter",
                     arbiter, "--prompts", str(prompts), "-n", "64", "-t", str(threads), *format_options, "--out",
                     str(file)])
    return json.loads(file.read_text())


def correct_by_problem(*folders: Path) -> dict[str, dict[str, bool]]:
    """problem id -> run label -> correct, over these eval folders' records (a later folder's run of
    the same label replaces an earlier one's)."""
    from cospec_local.evaluation.task_eval import load_records

    correct: dict[str, dict[str, bool]] = {}
    for folder in folders:
        for (problem_id, run), record in load_records(folder / "records.jsonl").items():
            correct.setdefault(problem_id, {})[run] = record.correct
    return correct


def recovered_and_lost(folders: tuple[Path, ...], mine: str) -> tuple[int, int]:
    """Of run `mine` against the main folder's target-only and draft-only: draft-only successes it
    solves that target-only misses, and target-only successes it misses."""
    rows = [c for c in correct_by_problem(*folders).values() if {"target-only", "draft-only", mine} <= set(c)]
    recovered = sum(c[mine] and c["draft-only"] and not c["target-only"] for c in rows)
    return recovered, sum(c["target-only"] and not c[mine] for c in rows)


def paired(folder: Path, mine: str) -> dict:
    """The same problems, two runs: those CoSpec gets right and target-only wrong (gained), the
    reverse (lost), and the exact two-sided sign test's p of that split (McNemar's exact test)."""
    both = [c for c in correct_by_problem(folder).values() if "target-only" in c and mine in c]
    gained = sum(c[mine] and not c["target-only"] for c in both)
    lost = sum(c["target-only"] and not c[mine] for c in both)
    n, k = gained + lost, min(gained, lost)
    p = min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n) if n else 1.0
    return {"gained": gained, "lost": lost, "p": p}


def interval(run: dict) -> str:
    low, high = run["accuracy_ci95"]
    return f"{run['accuracy']:.1%} ({low:.0%}-{high:.0%})"


def task_row(task: str, s: dict, arbiter: str, with_ngram: dict | None, pairs: dict,
             ngram_recovered_lost: tuple[int, int] | None) -> tuple[str, dict]:
    runs = s["runs"]
    t, d, sps, fly, c = (runs[k] for k in ("target-only", "draft-only", "sps", "fly", f"cospec:{arbiter}"))
    # Its own run, timed apart: its speed against sps is the ratio of tokens/s across runs.
    g = dict(with_ngram["runs"][f"cospec:{arbiter}"]) if with_ngram else None
    g_speed = g["predicted_per_second"] / sps["predicted_per_second"] if g else None
    if g is not None:
        g["recovered"], g["losses"] = ngram_recovered_lost
    wins = s["non_nested"]  # problems only the draft solves
    points = 100 * (c["accuracy"] - t["accuracy"])
    share = c["recovered"] / wins if wins else 0.0
    speed = c["speedup"] / sps["speedup"] if sps["speedup"] else 0.0
    beyond = c["accuracy_ci95"][0] > t["accuracy_ci95"][1]
    bars = {"points": points >= BARS["points"], "recovered_share": share >= BARS["recovered_share"],
            "losses": c["losses"] <= BARS["losses_per_recovery"] * c["recovered"],
            "speed_over_sps": speed >= BARS["speed_over_sps"]}
    fields = {"problems": s["problems"], "target": t["accuracy"], "target_ci95": t["accuracy_ci95"],
              "draft": d["accuracy"], "draft_ci95": d["accuracy_ci95"], "union": s["oracle_union"],
              "sps": sps["accuracy"], "fly": fly["accuracy"], "cospec": c["accuracy"], "cospec_ci95": c["accuracy_ci95"],
              "points_over_target": points, "draft_only_successes": wins, "recovered": c["recovered"],
              "recovered_share": share, "losses": c["losses"], "kept": c["arbiter_keeps"],
              "speedup_over_target": {"sps": sps["speedup"], "fly": fly["speedup"], "cospec": c["speedup"],
                                      "draft-only": d["speedup"]},
              "cospec_over_sps": speed, "beyond_intervals": beyond, "bars": bars, "paired": pairs,
              "cospec_with_ngram": None if g is None else {"accuracy": g["accuracy"], "accuracy_ci95": g["accuracy_ci95"],
                                                         "recovered": g["recovered"], "losses": g["losses"],
                                                         "tokens_per_second_over_sps": g_speed}}
    row = (f"| {task} | {s['problems']} | {interval(t)} | {interval(d)} | {s['oracle_union']:.1%} | "
           f"{sps['accuracy']:.1%} | {fly['accuracy']:.1%} | {interval(c)} | {points:+.1f} | "
           f"{c['recovered']}/{wins} ({share:.0%}) | {c['losses']} | {pairs['gained']} / {pairs['lost']}, "
           f"p = {pairs['p']:.2g} | {speed:.2f}x | "
           f"{sum(bars.values())}/4{' (beyond intervals)' if beyond else ''} |"
           + (f" {interval(g)}, {g['recovered']}/{wins} recovered, {g['losses']} lost, {g_speed:.2f}x |" if g else ""))
    return row, fields


def verdict(fields: dict, chat: float) -> str:
    """One line from the numbers: ship, or why not."""
    best_other = max(fields["draft"], fields["fly"])
    if fields["beyond_intervals"] and all(fields["bars"].values()) and chat >= BARS["chat_identical"]:
        return "ships: beats target-only beyond the intervals and clears every bar"
    if fields["beyond_intervals"]:
        missed = [name for name, ok in fields["bars"].items() if not ok] + (
            ["chat_identical"] if chat < BARS["chat_identical"] else [])
        return f"beats target-only beyond the intervals, misses {', '.join(missed)}"
    if best_other > fields["cospec"]:
        return "no reliable gain over target-only; the draft alone or FLy scores higher"
    return "no reliable gain over target-only"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arbiter", required=True, help="installed arbiter name (or folder)")
    ap.add_argument("--direction", default="gemma3-270m <- smollm2-135m", choices=sorted(DIRECTIONS))
    ap.add_argument("--tasks", default="capitals,antonyms,plurals")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("-n", type=int, default=24)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--limit", type=int, default=None, help="problems per task (default: all)")
    ap.add_argument("--chat-prompts", type=int, default=100)
    ap.add_argument("--with-ngram", action="store_true",
                    help="also CoSpec with n-gram blocks (--spec-type ngram,draft), in a run of its own")
    a = ap.parse_args(argv)
    rows, summary, loads = [], {}, []
    for task in a.tasks.split(","):
        s = run_eval(a.out, a.direction, task, a.arbiter, a.n, a.threads, a.limit)
        g = run_eval(a.out, a.direction, task, a.arbiter, a.n, a.threads, a.limit, ngram=True) if a.with_ngram else None
        mine = f"cospec:{a.arbiter}"
        row, summary[task] = task_row(task, s, a.arbiter, g, paired(a.out / task, mine),
                                      recovered_and_lost((a.out / task, a.out / f"{task}-ngram"), mine)
                                      if g is not None else None)
        if g is not None:
            loads.append(g.get("other_load") or 0.0)
        loads.append(s.get("other_load") or 0.0)
        rows.append(row)
        print(row, flush=True)
    chat = chat_identity(a.out, a.direction, a.arbiter, a.chat_prompts, a.threads)
    share = chat["identical_share"]
    verdicts = [f"- {task}: {verdict(fields, share)}" for task, fields in summary.items()]
    cmd = command("cross_vocab_arbiter.py", argv)
    lines = [f"# The arbiter {a.arbiter} on {a.direction}", "", f"`{' '.join(cmd)}`", "",
             f"Greedy, {a.n} tokens, each task's `test` split (the arbiter was trained on the `train` files); SmolLM2 "
             "through its chat template, Gemma 3 270M (a base model) through cospec_local/data/gemma3-smollm2/qa.jinja; scored on the "
             "reply's first line. Recovered: problems only the draft solves that CoSpec solves; lost: problems "
             "target-only solves that CoSpec misses. Speed: CoSpec's tokens/s over sps's, same run. Beyond the "
             "intervals: CoSpec's 95% interval above target-only's; the paired column tests the same problems' "
             "split.", "",
             "| task | problems | target-only (95% CI) | draft-only (95% CI) | union | sps | FLy | CoSpec (95% CI) | "
             "points over target | recovered / draft-only successes | lost | gained / lost against target-only, "
             "paired (exact sign test) | tokens/s over sps | bars met |"
             + (" CoSpec with n-gram blocks: accuracy, recovered, lost, tokens/s over sps (a run of its own) |"
                if a.with_ngram else ""),
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if a.with_ngram else ""), *rows, "",
             f"General chat: {chat['identical']}/{chat['prompts']} greedy replies (64 tokens) identical to target-only "
             f"({share:.1%}; bar {BARS['chat_identical']:.0%}); {chat['kept_tokens']} draft tokens kept in all, the "
             f"domain gate abstained on {chat['abstained']}.", "",
             f"Bars: >= +{BARS['points']:g} points, >= {BARS['recovered_share']:.0%} of draft-only successes recovered, "
             f"losses <= 1/3 of recoveries, >= {BARS['speed_over_sps']}x sps tokens/s (and chat above).", "",
             "Verdict:", *verdicts]
    report(lines, cmd, a.out, max(loads) if loads else 0.0, summary=summary, arbiter=a.arbiter,
           direction=a.direction, chat_identity={k: chat[k] for k in ("prompts", "identical", "identical_share",
                                                                      "kept_tokens", "abstained")},
           bars=BARS, at=time.strftime("%Y-%m-%d"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
