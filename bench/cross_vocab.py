"""A draft of another family: Gemma 3 270M and SmolLM2-135M-Instruct, each drafting for the other
through text (docs/modes-and-arbiters.md, "A draft of another family"). Open chat prompts
(bench/heldout_chat_prompts.txt), each model reading them in its own format: SmolLM2 through its
chat template, Gemma 3 270M (a base model, whose GGUF carries no template and which answers its turn
markers with noise) as "Question: ...\nAnswer:" (cospec_local/data/gemma3-smollm2/qa.jinja). Greedy, each prompt's
runs back to back in a rotating order, repeated.

    python bench/cross_vocab.py -n 96 --repeats 2 --out bench/cross_vocab

Per direction: target-only; the draft at a fixed K = 4 (its agreement: the share of proposed
target tokens accepted); the draft with adaptive lengths as `generate` runs it. Reports tokens/s
over target-only's (pooled over every prompt and repeat, and the geometric mean per prompt), the
draft's agreement, and whether every output equals target-only's.
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

RUNS = {"target-only": {"mode": "target-only"},
        "draft K=4": {"spec_type": "draft", "adaptive_draft": False, "draft_max": 4},
        "draft adaptive": {"spec_type": "draft"}}


def main(argv=None) -> int:
    from cospec_local import Engine
    from cospec_local.evaluation.machine import OtherLoad
    from cospec_local.models import resolve_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=96)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--prompts", type=Path, default=REPO / "bench" / "heldout_chat_prompts.txt")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--no-repack", dest="repack", action="store_false",
                    help="llama.cpp's plain CPU kernels (default: weight repacking on, as users run it)")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    questions = [q for q in a.prompts.read_text().splitlines() if q.strip()][: a.limit]
    # (target, draft, target's template, draft's template): SmolLM2's own, Gemma's a question/answer form.
    qa = (REPO / "cospec_local" / "data" / "gemma3-smollm2" / "qa.jinja").read_text()
    pairs = {"gemma3-270m <- smollm2-135m": ("gemma3-270m", "smollm2-135m", qa, None),
             "smollm2-135m <- gemma3-270m": ("smollm2-135m", "gemma3-270m", None, qa)}
    load = OtherLoad()
    summary = {}
    for label, (target, draft, template, draft_template) in pairs.items():
        tokens = {n: 0 for n in RUNS}
        ms = {n: 0.0 for n in RUNS}
        per_prompt = {n: [] for n in RUNS}
        same = {n: 0 for n in RUNS}
        proposed = {n: 0 for n in RUNS}
        accepted = {n: 0 for n in RUNS}
        with Engine(resolve_model(target), resolve_model(draft), n_ctx=2048, n_threads=a.threads, repack=a.repack,
                    chat_template=template, draft_chat_template=draft_template) as engine:
            messages = [[{"role": "user", "content": q}] for q in questions]
            prompts = [(engine.render_chat(m), engine.render_draft_chat(m)) for m in messages]
            names = list(RUNS)
            for repeat in range(a.repeats):
                for i, (prompt, draft_prompt) in enumerate(prompts):
                    order = names[(i + repeat) % len(names):] + names[:(i + repeat) % len(names)]
                    results = {}
                    for name in order:
                        engine.reset()
                        with load.window():
                            results[name] = engine.generate(prompt, max_tokens=a.n, draft_prompt=draft_prompt,
                                                            **RUNS[name])
                    base = results["target-only"]
                    for name, r in results.items():
                        tokens[name] += r.stats.predicted_n
                        ms[name] += r.stats.predicted_ms
                        per_prompt[name].append(r.stats.predicted_per_second / base.stats.predicted_per_second)
                        same[name] += r.tokens == base.tokens
                        proposed[name] += r.stats.draft_n
                        accepted[name] += r.stats.draft_n_matched
                print(f"{label}, repeat {repeat + 1}: " + ", ".join(
                    f"{n} {tokens[n] / ms[n] * 1000:.1f} tok/s" for n in names), flush=True)
        base_rate = tokens["target-only"] / ms["target-only"]
        summary[label] = {n: {"pooled": tokens[n] / ms[n] / base_rate,
                              "geomean": math.exp(sum(map(math.log, per_prompt[n])) / len(per_prompt[n])),
                              "agreement": accepted[n] / proposed[n] if proposed[n] else None,
                              "proposed": proposed[n], "identical": same[n], "runs": len(per_prompt[n]),
                              "tokens_per_s": tokens[n] / ms[n] * 1000} for n in RUNS}
    cmd = command("cross_vocab.py", argv)
    lines = [f"# A draft of another family on {len(questions)} open chat prompts", "",
             f"`{' '.join(cmd)}`", "",
             f"Each model reads the prompt in its own format (SmolLM2 its chat template, Gemma 3 270M, a base model, "
             f"cospec_local/data/gemma3-smollm2/qa.jinja), greedy, up to {a.n} tokens, {a.threads} threads, "
             f"{a.repeats} repeats in rotating order, each reply from a reset engine.", "",
             "| target <- draft | run | tokens/s | over target-only (pooled) | geometric mean per prompt | agreement | "
             "same as target-only |", "|---|---|---|---|---|---|---|"]
    for label, runs in summary.items():
        for n, s in runs.items():
            agreement = f"{s['agreement']:.1%} of {s['proposed']}" if s["agreement"] is not None else ""
            lines.append(f"| {label} | {n} | {s['tokens_per_s']:.1f} | {s['pooled']:.3f}x | {s['geomean']:.3f}x | "
                         f"{agreement} | {s['identical']} of {s['runs']} |")
    report(lines, cmd, a.out, load.share, summary=summary, at=time.strftime("%Y-%m-%d"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
