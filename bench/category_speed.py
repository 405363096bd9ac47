"""Speed per task category, where users run it: each prompt of a category suite (multi-turn chat,
code, math, grounded QA, summarization, translation: bench/category_prompts.jsonl, in the shape of
Spec-Bench and SPEED-Bench) through the target's chat template, one fresh `cospec-local generate`
process per reply, target-only and the engine's default draft sources, beside llama.cpp's
`llama-speculative-simple` with each of its spec types, at its default block length and at the
engine's (`--draft-max`); both sides at their defaults otherwise (weight repacking on). Greedy, the
same number of tokens (end of text ignored), the same threads.

    python bench/category_speed.py -m smollm2-135m-q4_0-as-1b -md smollm2-135m-draft -n 128 -t 2 \\
        --limit 4 --llama-types draft-simple,ngram-mod --out bench/category_speed/q4_0-as-1b

Per category: tokens/s over target-only (geometric mean of per-prompt ratios), draft tokens
accepted per target pass, acceptance, the share of the ceiling the calibration allows at that
acceptance (bench/speed_ceiling.py), and llama.cpp's best type there; with --out, results.json,
results.md and a plot (results.png).
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

from fresh_process import generate  # noqa: E402
from ngram_vs_llama_cpp import build_speculative_simple, geomean, run_speculative_simple  # noqa: E402
from results_report import command, report  # noqa: E402
from speed_ceiling import best_block  # noqa: E402


def read_suite(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def run_llama(binary: Path, target: Path, draft: Path | None, prompt: str, kind: str, n: int, threads: int,
              draft_max: int | None) -> dict:
    """llama-speculative-simple at its defaults but the block length asked: speed and counts."""
    args = ["-m", str(target), "-p", prompt, "--spec-type", kind, "-n", str(n), "--temp", "0", "--top-k", "1",
            "--ignore-eos", "-t", str(threads), "-td", str(threads), "-c", "4096"]
    if draft is not None and kind.startswith("draft"):
        args += ["-md", str(draft)]
    if draft_max is not None:
        args += ["--spec-draft-n-max", str(draft_max)]
    run = run_speculative_simple(binary, args, kind)
    passes = max(1, run["tokens"] - run["accepted"])  # each pass emits its accepted tokens + 1
    return {**run, "accepted_per_pass": run["accepted"] / passes}


def main(argv=None) -> int:
    from cospec_local import Engine
    from cospec_local.evaluation.machine import OtherLoad
    from cospec_local.models import resolve_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-md", "--model-draft", default=None)
    ap.add_argument("--prompts", type=Path, default=REPO / "bench" / "category_prompts.jsonl")
    ap.add_argument("--categories", default=None, help="comma list (default: every category of the suite)")
    ap.add_argument("--limit", type=int, default=None, help="prompts per category (default: all)")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--draft-max", type=int, default=4, help="the block length llama.cpp also runs at (beside its default)")
    ap.add_argument("--llama-types", default="draft-simple,ngram-mod,ngram-simple,ngram-map-k",
                    help="llama-speculative-simple's spec types to run (comma list)")
    ap.add_argument("--llama-bin", type=Path, default=REPO / "build" / "llama-tools")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    suite = read_suite(a.prompts)
    wanted = a.categories.split(",") if a.categories else list(dict.fromkeys(p["category"] for p in suite))
    chosen = [p for c in wanted for p in [q for q in suite if q["category"] == c][: a.limit]]
    target, draft = resolve_model(a.model), resolve_model(a.model_draft) if a.model_draft else None
    types = [t for t in a.llama_types.split(",") if t and (draft is not None or not t.startswith("draft"))]
    binary = build_speculative_simple(a.llama_bin)
    # The prompts through the target's template, and the pair's calibration (measured now if none).
    with Engine(target, draft, n_threads=a.threads) as engine:
        rendered = [engine.render_chat(p["messages"], add_generation_prompt=True) for p in chosen]
        # As text both programs tokenize with their BOS added and special tokens parsed: the template's BOS goes.
        added = engine.tokenize("", add_special=True)  # [BOS] where the target's tokenizer adds one
        texts = [engine.detokenize(r[len(added):] if added and r[:len(added)] == added else r, render_special=True)
                 for r in rendered]
        numbers = engine.calibration.numbers if engine.calibration is not None else None
        calibration_id = engine.calibration_id
    common = ["-m", a.model, "-n", str(a.n), "--ignore-eos", "-t", str(a.threads)]
    if a.model_draft:
        common += ["-md", a.model_draft]
    rows = []
    load = OtherLoad()
    started = time.time()
    for p, text in zip(chosen, texts):
        with load.window():
            plain = generate([*common, "--mode", "target-only"], text)
            spec = generate(common, text)
            llama = {f"{k}@default": run_llama(binary, target, draft, text, k, a.n, a.threads, None) for k in types}
            llama.update({f"{k}@{a.draft_max}": run_llama(binary, target, draft, text, k, a.n, a.threads, a.draft_max)
                          for k in types})
        ps, ss = plain["stats"], spec["stats"]
        drafted, matched = ss["draft_n"], ss["draft_n_matched"]
        rows.append({"category": p["category"], "id": p["id"], "target_only_tps": ps["predicted_per_second"],
                     "spec_tps": ss["predicted_per_second"], "identical": spec["tokens"] == plain["tokens"],
                     "drafted": drafted, "accepted": matched, "blocks": ss["blocks"],
                     "blocks_ngram": ss["blocks_ngram"], "llama": llama})
        print(f"{p['id']:>16} target-only {ps['predicted_per_second']:6.1f}  engine {ss['predicted_per_second']:6.1f} "
              f"({ss['predicted_per_second'] / ps['predicted_per_second']:.2f}x, {matched}/{drafted} accepted)  "
              + "  ".join(f"{k} {v['tps']:.1f}" for k, v in llama.items()), flush=True)
    by_category = defaultdict(list)
    for r in rows:
        by_category[r["category"]].append(r)
    summary = {}
    for c, rs in by_category.items():
        drafted, accepted, blocks = (sum(r[k] for r in rs) for k in ("drafted", "accepted", "blocks"))
        acceptance = accepted / drafted if drafted else 0.0
        speed = geomean([r["spec_tps"] / r["target_only_tps"] for r in rs])
        # (plain steps where no block length pays: 1.0x)
        ceiling = max(1.0, best_block(numbers, acceptance)[0]) if numbers and numbers["draft_step"] > 0 else None
        llama_speed = {k: geomean([r["llama"][k]["tps"] / r["target_only_tps"] for r in rs]) for k in rs[0]["llama"]}
        best = max(llama_speed, key=llama_speed.get) if llama_speed else None
        summary[c] = {"prompts": len(rs), "spec_over_target_only": speed, "acceptance": acceptance,
                      "accepted_per_block": accepted / blocks if blocks else 0.0,
                      "ceiling": ceiling, "share_of_ceiling": speed / ceiling if ceiling else None,
                      "identical": sum(r["identical"] for r in rs), "llama_over_target_only": llama_speed,
                      "llama_best": best,
                      "spec_over_llama_best": speed / llama_speed[best] if best else None,
                      "llama_accepted_per_pass": {k: sum(r["llama"][k]["accepted_per_pass"] for r in rs) / len(rs)
                                                  for k in rs[0]["llama"]}}
    overall = geomean([s["spec_over_target_only"] for s in summary.values()])
    cmd = command("category_speed.py", argv)
    lines = [f"# Speed per task category: {a.model}" + (f" <- {a.model_draft}" if a.model_draft else ""), "",
             f"`{' '.join(cmd)}`", "",
             f"{len(rows)} prompts of {a.prompts.name} ({a.limit or 'all'} a category) through the chat template, "
             f"a fresh process per reply, greedy, {a.n} tokens (end ignored), {a.threads} threads, calibration "
             f"{calibration_id}; llama.cpp's `llama-speculative-simple` at its defaults and at "
             f"`--spec-draft-n-max {a.draft_max}`.", "",
             "| category | engine x target-only | accepted per block | acceptance | share of ceiling | identical | "
             "llama.cpp's best (x target-only) | engine x llama.cpp's best |",
             "|---|---|---|---|---|---|---|---|"]
    for c, s in summary.items():
        share = f"{s['share_of_ceiling']:.0%} of {s['ceiling']:.2f}x" if s["ceiling"] else "-"
        best = f"`{s['llama_best']}` {s['llama_over_target_only'][s['llama_best']]:.2f}x" if s["llama_best"] else "-"
        over = f"{s['spec_over_llama_best']:.2f}x" if s["llama_best"] else "-"
        lines.append(f"| {c} | {s['spec_over_target_only']:.2f}x | {s['accepted_per_block']:.2f} | "
                     f"{s['acceptance']:.0%} | {share} | {s['identical']}/{s['prompts']} | {best} | {over} |")
    lines += ["", f"Geometric mean over categories: {overall:.2f}x target-only."]
    report(lines, cmd, a.out, load.share, model=a.model, draft=a.model_draft, n=a.n, threads=a.threads,
           draft_max=a.draft_max, calibration=calibration_id, seconds=time.time() - started, summary=summary,
           overall=overall, rows=rows)
    if a.out is not None:
        plot(summary, a.out / "results.png", f"{a.model}" + (f" <- {a.model_draft}" if a.model_draft else ""))
    return 0


def plot(summary: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    categories = list(summary)
    ours = [summary[c]["spec_over_target_only"] for c in categories]
    theirs = [summary[c]["llama_over_target_only"][summary[c]["llama_best"]] if summary[c]["llama_best"] else 0
              for c in categories]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    x = range(len(categories))
    ax.bar([i - 0.2 for i in x], ours, 0.4, label="cospec-local (default sources)")
    ax.bar([i + 0.2 for i in x], theirs, 0.4, label="llama-speculative-simple (best type)")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(list(x), categories)
    ax.set_ylabel("x target-only tokens/s")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    sys.exit(main())
