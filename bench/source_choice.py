"""Whether speculation ever runs below the target alone where its draft sources do not pay: open
chat prompts (bench/heldout_chat_prompts.txt, through the target's chat template), greedy, adaptive
lengths as `generate` and `chat` run them, each prompt's runs back to back in a rotating order,
repeated. Runs: target-only; `-m` alone (the n-gram drafter, no draft model); the draft model alone
(`--spec-type draft`); both (`ngram,draft`).

    python bench/source_choice.py -m smollm2-135m -md smollm2-135m-draft -n 128 --repeats 2 --out bench/source_choice

Reports each run's tokens/s over target-only's, pooled over every prompt and repeat (total tokens
over total time) and as the geometric mean of per-prompt ratios, and whether every output equals
target-only's. Each reply starts from a reset engine (no n-gram pool of earlier replies, no cached
prompt): the worst case for the n-gram drafter, a new conversation.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from results_report import command, report  # noqa: E402
RUNS = {"target-only": ("target-only", None, False), "ngram": ("speculative", "ngram", False),
        "draft": ("speculative", "draft", True), "ngram,draft": ("speculative", "ngram,draft", True)}


def main(argv=None) -> int:
    from cospec_local import Engine
    from cospec_local.evaluation.machine import OtherLoad
    from cospec_local.models import resolve_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("-md", "--draft", default="smollm2-135m-draft")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--prompts", type=Path, default=REPO / "bench" / "heldout_chat_prompts.txt")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    questions = [q for q in a.prompts.read_text().splitlines() if q.strip()][: a.limit]
    names = list(RUNS)
    # One engine per way of loading, as a user would run them: -m alone, and -m with -md.
    engines = {False: Engine(resolve_model(a.model), None, n_ctx=2048, n_threads=a.threads),
               True: Engine(resolve_model(a.model), resolve_model(a.draft), n_ctx=2048, n_threads=a.threads)}
    tokens = {n: 0 for n in names}
    ms = {n: 0.0 for n in names}
    per_prompt = {n: [] for n in names}
    same = {n: 0 for n in names}
    load = OtherLoad()
    try:
        prompts = [engines[False].render_chat([{"role": "user", "content": q}]) for q in questions]
        for repeat in range(a.repeats):
            for i, prompt in enumerate(prompts):
                order = names[(i + repeat) % len(names):] + names[:(i + repeat) % len(names)]
                results = {}
                for name in order:
                    mode, spec_type, with_draft = RUNS[name]
                    extra = {"spec_type": spec_type} if spec_type else {}
                    # Each reply from a fresh engine: the n-gram pool would otherwise hold this very
                    # prompt's earlier replies (a repeat, or another run's), and predict them whole.
                    engines[with_draft].reset()
                    with load.window():
                        results[name] = engines[with_draft].generate(prompt, mode=mode, max_tokens=a.n, **extra)
                for name, r in results.items():
                    tokens[name] += r.stats.predicted_n
                    ms[name] += r.stats.predicted_ms
                    per_prompt[name].append(r.stats.predicted_per_second / results["target-only"].stats.predicted_per_second)
                    same[name] += r.tokens == results["target-only"].tokens
            print(f"repeat {repeat + 1}: " + ", ".join(
                f"{n} {tokens[n] / ms[n] * 1000:.1f} tok/s" for n in names), flush=True)
    finally:
        for engine in engines.values():
            engine.close()
    base = tokens["target-only"] / ms["target-only"]
    summary = {n: {"pooled": tokens[n] / ms[n] / base,
                   "geomean": math.exp(sum(map(math.log, per_prompt[n])) / len(per_prompt[n])),
                   "identical": same[n], "runs": len(per_prompt[n])} for n in names}
    cmd = command("source_choice.py", argv)
    lines = [f"# Draft sources on {len(questions)} open chat prompts", "",
             f"`{' '.join(cmd)}`", "",
             f"Target {a.model}, draft model {a.draft}, chat template, greedy, up to {a.n} tokens, adaptive lengths, "
             f"{a.threads} threads, {a.repeats} repeats in rotating order.", "",
             "| run | tokens/s over target-only (pooled) | geometric mean per prompt | same as target-only |",
             "|---|---|---|---|"]
    lines += [f"| {n} | {s['pooled']:.3f}x | {s['geomean']:.3f}x | {s['identical']} of {s['runs']} |"
              for n, s in summary.items()]
    report(lines, cmd, a.out, load.share, summary=summary, at=time.strftime("%Y-%m-%d"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
