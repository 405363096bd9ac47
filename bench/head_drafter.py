"""An EAGLE-3 head in the engine against target-only decoding and against llama.cpp's own
`llama-speculative-simple --spec-type draft-eagle3` with the same head GGUF, built from the
vendored source against the very libraries the engine runs. Held-out chat prompts
(bench/heldout_chat_prompts.txt, rendered by the target's chat template), greedy, end-of-text
respected, the same threads; prompts in turn, each program's runs beside each other, each of the
engine's from an empty cache (a reset keeps what its tuners learned).

    python bench/head_drafter.py -m smollm2-135m --head smollm2-135m-eagle3 -k 3 -n 160 -t 2 --out bench/head_drafter/smollm2

For each prompt: target-only, the engine's head at fixed K (`--spec-type draft-eagle3
--draft-max K`, adaptive length off), the engine's head with its tuner (`--draft-max K`, adaptive),
and llama.cpp at `--spec-draft-n-max K`. Prints per-prompt tokens/s, the head's mean accepted
length per block, and whether every output equals target-only's; writes results.json and
results.md with --out. With --grounded, also `ngram,draft-eagle3` against `ngram` alone on the
input-grounded prompts (bench/grounded_prompts.jsonl, raw, 160 tokens, end-of-text ignored).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from ngram_vs_llama_cpp import build_speculative_simple, geomean, run_speculative_simple  # noqa: E402
from results_report import command, report  # noqa: E402


def run_llama(binary: Path, target: Path, head: Path, prompt: str, k: int, n: int, threads: int) -> dict:
    return run_speculative_simple(binary, ["-m", str(target), "-md", str(head), "--spec-type", "draft-eagle3",
                                           "--spec-draft-n-max", str(k), "-p", prompt, "-n", str(n), "--temp", "0",
                                           "--top-k", "1", "-t", str(threads), "-td", str(threads),
                                           "-c", "4096"], "draft-eagle3")


def head_run(engine, prompt, n: int, k: int, adaptive: bool, spec_type: str = "draft-eagle3", **kw) -> dict:
    r = engine.generate(prompt, max_tokens=n, spec_type=spec_type, draft_max=k, adaptive_draft=adaptive, **kw)
    s = r.stats
    return {"tps": s.predicted_per_second, "tokens": r.tokens, "blocks_head": s.blocks_head,
            "drafted_head": s.draft_n_head, "accepted_head": s.draft_n_matched_head, "blocks": s.blocks,
            "drafted_ngram": s.draft_n_ngram, "accepted_ngram": s.draft_n_matched_ngram, "draft_ms": s.draft_ms}


def main(argv=None) -> int:
    from cospec_local import Engine
    from cospec_local.evaluation.machine import OtherLoad
    from cospec_local.models import resolve_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("--head", default="smollm2-135m-eagle3", help="EAGLE-3 head GGUF or named model")
    ap.add_argument("-k", type=int, default=3, help="block length K (llama.cpp's --spec-draft-n-max)")
    ap.add_argument("-n", type=int, default=160)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--prompts", type=Path, default=REPO / "bench" / "heldout_chat_prompts.txt")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--grounded", type=Path, default=None, help="also ngram,draft-eagle3 against ngram on these")
    ap.add_argument("--llama-bin", type=Path, default=REPO / ".cache" / "llama-bin")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    prompts = [p for p in a.prompts.read_text().splitlines() if p.strip()][: a.limit]
    binary = build_speculative_simple(a.llama_bin)
    target, head = resolve_model(a.model), resolve_model(a.head)
    rows, grounded = [], []
    load = OtherLoad()
    started = time.time()
    with Engine(target, head, n_ctx=4096, n_threads=a.threads) as engine:
        if engine.head != "eagle3":
            sys.exit(f"{a.head} did not open as an EAGLE-3 head")
        engine.generate("Warm up.", max_tokens=8, mode="target-only")
        for i, p in enumerate(prompts):
            text = engine.detokenize(engine.render_chat([{"role": "user", "content": p}]), render_special=True)
            with load.window():
                # Each run from an empty cache, as llama.cpp's program starts (a run after another
                # on the same prompt would reuse its cache and hear its own output replayed).
                engine.reset()
                plain = engine.generate(text, max_tokens=a.n, mode="target-only")
                engine.reset()
                fixed = head_run(engine, text, a.n, a.k, adaptive=False)
                engine.reset()
                tuned = head_run(engine, text, a.n, a.k, adaptive=True)
                llama = run_llama(binary, target, head, text, a.k, a.n, a.threads)
            row = {"prompt": p, "target_only_tps": plain.stats.predicted_per_second, "tokens": len(plain.tokens),
                   "fixed": fixed | {"identical": fixed.pop("tokens") == plain.tokens},
                   "tuned": tuned | {"identical": tuned.pop("tokens") == plain.tokens}, "llama": llama}
            rows.append(row)
            f = row["fixed"]
            print(f"{i + 1:2d} target-only {row['target_only_tps']:6.1f}  head K={a.k} {f['tps']:6.1f} "
                  f"({f['tps'] / row['target_only_tps']:.2f}x, {f['accepted_head'] / max(1, f['blocks_head']):.2f}/block, "
                  f"{'same' if f['identical'] else 'DIFFERENT'})  tuned {row['tuned']['tps']:6.1f}  "
                  f"llama.cpp {llama['tps']:6.1f} (accept {llama['acceptance']})", flush=True)
        if a.grounded is not None:
            items = [json.loads(line) for line in a.grounded.read_text().splitlines() if line.strip()][: a.limit]
            for p in items:
                with load.window():
                    engine.reset()
                    plain = engine.generate(p["prompt"], max_tokens=a.n, mode="target-only", ignore_eos=True)
                    engine.reset()
                    ngram = head_run(engine, p["prompt"], a.n, a.k, True, "ngram", ignore_eos=True)
                    engine.reset()
                    both = head_run(engine, p["prompt"], a.n, a.k, True, "ngram,draft-eagle3", ignore_eos=True)
                grounded.append({"kind": p["kind"], "target_only_tps": plain.stats.predicted_per_second,
                                 "ngram": ngram | {"identical": ngram.pop("tokens") == plain.tokens},
                                 "ngram_head": both | {"identical": both.pop("tokens") == plain.tokens}})
                g = grounded[-1]
                print(f"grounded {p['kind']:<20} ngram {g['ngram']['tps']:6.1f}  ngram,head {g['ngram_head']['tps']:6.1f}",
                      flush=True)

    def ratio(key, base="target_only_tps"):
        return geomean([r[key]["tps"] / r[base] for r in rows])

    summary = {
        "prompts": len(rows), "k": a.k,
        "fixed_over_target_only": ratio("fixed"), "tuned_over_target_only": ratio("tuned"),
        "llama_over_target_only": ratio("llama"),
        "fixed_over_llama": geomean([r["fixed"]["tps"] / r["llama"]["tps"] for r in rows]),
        "tuned_over_llama": geomean([r["tuned"]["tps"] / r["llama"]["tps"] for r in rows]),
        "accepted_per_block": sum(r["fixed"]["accepted_head"] for r in rows) / max(1, sum(r["fixed"]["blocks_head"] for r in rows)),
        "acceptance": sum(r["fixed"]["accepted_head"] for r in rows) / max(1, sum(r["fixed"]["drafted_head"] for r in rows)),
        "llama_acceptance": sum((r["llama"]["acceptance"] or 0) for r in rows) / len(rows),
        "identical_fixed": sum(r["fixed"]["identical"] for r in rows),
        # a head draft token's cost in target steps (a target step: 1 / target-only's tokens/s)
        "head_step_cost": (sum(r["fixed"]["draft_ms"] for r in rows) / max(1, sum(r["fixed"]["drafted_head"] for r in rows)))
                          / (1000.0 * len(rows) / sum(r["target_only_tps"] for r in rows)),
        "identical_tuned": sum(r["tuned"]["identical"] for r in rows),
    }
    if grounded:
        summary["grounded_ngram_over_target_only"] = geomean([g["ngram"]["tps"] / g["target_only_tps"] for g in grounded])
        summary["grounded_ngram_head_over_target_only"] = geomean([g["ngram_head"]["tps"] / g["target_only_tps"] for g in grounded])
        summary["grounded_identical"] = sum(g["ngram"]["identical"] and g["ngram_head"]["identical"] for g in grounded)
    cmd = command("head_drafter.py", argv)
    lines = [f"# An EAGLE-3 head on {len(rows)} held-out chat prompts", "", f"`{' '.join(cmd)}`", "",
             f"Target {a.model}, head {a.head}, chat-templated prompts, greedy, up to {a.n} tokens (end-of-text "
             f"respected), {a.threads} threads; geometric means of per-prompt ratios of generation tokens/s.", "",
             "| run | x target-only | accepted per block | outputs = target-only |", "|---|---|---|---|",
             f"| engine, head at K = {a.k} | {summary['fixed_over_target_only']:.2f}x | {summary['accepted_per_block']:.2f} "
             f"({summary['acceptance']:.1%} of drafted) | {summary['identical_fixed']} of {len(rows)} |",
             f"| engine, head with its tuner (K <= {a.k}) | {summary['tuned_over_target_only']:.2f}x | | "
             f"{summary['identical_tuned']} of {len(rows)} |",
             f"| llama-speculative-simple `--spec-type draft-eagle3 --spec-draft-n-max {a.k}` | "
             f"{summary['llama_over_target_only']:.2f}x | ({summary['llama_acceptance']:.1%} of drafted) | |", "",
             f"Engine over llama.cpp: {summary['fixed_over_llama']:.2f}x at K = {a.k}, "
             f"{summary['tuned_over_llama']:.2f}x with the tuner. A head draft token costs "
             f"{summary['head_step_cost']:.3f} of a target step."]
    if grounded:
        lines += ["", f"Input-grounded prompts ({len(grounded)}, raw, end-of-text ignored): `ngram` "
                      f"{summary['grounded_ngram_over_target_only']:.2f}x target-only, `ngram,draft-eagle3` "
                      f"{summary['grounded_ngram_head_over_target_only']:.2f}x; both identical to target-only on "
                      f"{summary['grounded_identical']} of {len(grounded)}."]
    report(lines, cmd, a.out, load.share, model=a.model, head=a.head, k=a.k, n=a.n, threads=a.threads,
           seconds=time.time() - started, summary=summary, rows=rows, grounded=grounded)
    return 0


if __name__ == "__main__":
    sys.exit(main())
