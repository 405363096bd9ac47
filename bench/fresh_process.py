"""Speed where users run it: each reply from a fresh `cospec-local generate` process, as a shell
script or an editor plugin runs it, target-only and speculative alternating prompt by prompt, and
optionally llama.cpp's own `llama-speculative-simple` n-gram kinds (fresh processes by nature) on
the same raw prompts. Greedy by default; --sampled uses `chat`'s sampling defaults with a fixed
seed and runs each speculative reply twice, in two processes, to check it reproduces.

    python bench/fresh_process.py -m smollm2-135m-as-1b --spec-type ngram --prompts bench/grounded_prompts.jsonl \\
        -n 160 --llama-kinds ngram-mod,ngram-simple --out bench/fresh_process/grounded
    python bench/fresh_process.py -m smollm2-135m -md smollm2-135m-draft --chat --sampled \\
        --prompts bench/heldout_chat_prompts.txt -n 96 --out bench/fresh_process/sampled_chat

Each process takes the pair's stored calibration (`cospec-local calibrate` first; the record names
its id, and `--calibration none` measures the uncalibrated start). Speeds are the generation's
tokens/s as each process reports it (its load excluded, as llama.cpp's own tools count); ratios are
geometric means of per-prompt ratios, with the pooled one beside them.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from ngram_vs_llama_cpp import build_speculative_simple, geomean, run_llama  # noqa: E402
from results_report import command, report  # noqa: E402

CHAT_FLAGS = ["--temp", "0.8", "--top-k", "40", "--top-p", "0.95", "--min-p", "0.05", "--repeat-penalty", "1.1"]


def read_prompts(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        return [json.loads(line)["prompt"] for line in text.splitlines() if line.strip()]
    return [line for line in text.splitlines() if line.strip()]


def generate(args: list[str], prompt: str) -> dict:
    cmd = [sys.executable, "-m", "cospec_local.cli", "generate", "--json", "-f", "-", *args]
    done = subprocess.run(cmd, input=prompt, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout)


def main(argv=None) -> int:
    from cospec_local.evaluation.machine import OtherLoad
    from cospec_local.models import resolve_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-md", "--model-draft", default=None)
    ap.add_argument("--spec-type", default="auto")
    ap.add_argument("--arbiter", default="target")
    ap.add_argument("--prompts", type=Path, required=True, help="a .jsonl file of {\"prompt\"} or a text file, one a line")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--chat", action="store_true", help="send each prompt through the chat template")
    ap.add_argument("--sampled", action="store_true", help="chat's sampling defaults, a fixed seed per prompt")
    ap.add_argument("-n", type=int, default=96)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--calibration", default="auto")
    ap.add_argument("--spec-args", default="", help="more `generate` options for the speculative processes")
    ap.add_argument("--llama-kinds", default="", help="llama.cpp n-gram kinds to run beside (comma list)")
    ap.add_argument("--llama-bin", type=Path, default=REPO / ".cache" / "llama-bin")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    prompts = read_prompts(a.prompts)[: a.limit]
    kinds = [k for k in a.llama_kinds.split(",") if k]
    binary = build_speculative_simple(a.llama_bin) if kinds else None
    common = ["-m", a.model, "-n", str(a.n), "--ignore-eos", "-t", str(a.threads), "--calibration", a.calibration,
              *(["--chat"] if a.chat else [])]
    if a.model_draft:
        common += ["-md", a.model_draft]
    rows = []
    load = OtherLoad()
    started = time.time()
    for i, prompt in enumerate(prompts):
        seed = ["-s", str(1000 + i), *CHAT_FLAGS] if a.sampled else []
        with load.window():
            plain = generate([*common, *seed, "--mode", "target-only"], prompt)
            spec_args = [*common, *seed, "--spec-type", a.spec_type, "--arbiter", a.arbiter, *a.spec_args.split()]
            spec = generate(spec_args, prompt)
            again = generate(spec_args, prompt) if a.sampled else None
            llama = {k: run_llama(binary, resolve_model(a.model), prompt, k, a.n, a.threads) for k in kinds}
        ps, ss = plain["stats"], spec["stats"]
        row = {"target_only_tps": ps["predicted_per_second"], "spec_tps": ss["predicted_per_second"],
               "target_only_ms": ps["predicted_ms"], "spec_ms": ss["predicted_ms"], "tokens": ss["predicted_n"],
               "identical": spec["tokens"] == plain["tokens"], "calibration": spec["calibration"],
               "reproduced": None if again is None else again["tokens"] == spec["tokens"],
               "blocks": ss["blocks"], "blocks_ngram": ss["blocks_ngram"], "draft_n": ss["draft_n"],
               "draft_n_matched": ss["draft_n_matched"], "plain": ss["plain"],
               "first_step_plain": spec["provenance"][:1] == ["target"],
               "llama": {k: v["tps"] for k, v in llama.items()}}
        rows.append(row)
        extra = "".join(f"  {k} {v:6.1f}" for k, v in row["llama"].items())
        print(f"{i + 1:2d} target-only {row['target_only_tps']:7.1f}  speculative {row['spec_tps']:7.1f} "
              f"({row['spec_tps'] / row['target_only_tps']:.2f}x; blocks {row['blocks']}, n-gram {row['blocks_ngram']}, "
              f"accepted {row['draft_n_matched']}/{row['draft_n']})"
              + ("" if a.sampled else f"  {'same' if row['identical'] else 'DIFFERENT'}")
              + ("" if row["reproduced"] is None else f"  {'reproduced' if row['reproduced'] else 'NOT REPRODUCED'}")
              + extra, flush=True)
    ratio = geomean([r["spec_tps"] / r["target_only_tps"] for r in rows])
    pooled = sum(r["target_only_ms"] for r in rows) / sum(r["spec_ms"] for r in rows)
    summary = {"spec_over_target_only": ratio, "pooled": pooled, "prompts": len(rows),
               "identical": sum(r["identical"] for r in rows),
               "reproduced": None if not a.sampled else sum(bool(r["reproduced"]) for r in rows),
               "first_step_plain": sum(r["first_step_plain"] for r in rows),
               "calibrations": sorted({str(r["calibration"]) for r in rows}),
               "llama_over_target_only": {k: geomean([r["llama"][k] / r["target_only_tps"] for r in rows]) for k in kinds},
               "spec_over_llama": {k: geomean([r["spec_tps"] / r["llama"][k] for r in rows]) for k in kinds}}
    cmd = command("fresh_process.py", argv)
    what = (f"{a.model}" + (f" <- {a.model_draft}" if a.model_draft else "") + f", --spec-type {a.spec_type}, "
            f"arbiter {a.arbiter}, {'chat sampling (seed per prompt)' if a.sampled else 'greedy'}, "
            f"{'chat template' if a.chat else 'raw prompts'}, {a.n} tokens (end ignored), {a.threads} threads, "
            f"calibration {', '.join(summary['calibrations'])}")
    lines = [f"# A fresh process per reply: {len(rows)} prompts of {a.prompts.name}", "", f"`{' '.join(cmd)}`", "",
             what + ".", "", "| run | x target-only (geomean) | pooled | speculative over it |", "|---|---|---|---|",
             f"| speculative | {ratio:.3f}x | {pooled:.3f}x | |"]
    lines += [f"| llama-speculative-simple `--spec-type {k}` | {summary['llama_over_target_only'][k]:.3f}x | | "
              f"{summary['spec_over_llama'][k]:.3f}x |" for k in kinds]
    lines += ["", f"Outputs identical to target-only: {summary['identical']} of {len(rows)}"
              + (" (sampled: not expected)" if a.sampled else "")
              + (f"; each speculative reply reproduced by a second process with its seed: {summary['reproduced']} of "
                 f"{len(rows)}" if a.sampled else "")
              + f". Replies whose first step was a plain one: {summary['first_step_plain']} of {len(rows)}."]
    report(lines, cmd, a.out, load.share, model=a.model, draft=a.model_draft, spec_type=a.spec_type,
           arbiter=a.arbiter, sampled=a.sampled, n=a.n, threads=a.threads, seconds=time.time() - started,
           summary=summary, rows=rows, environment={k: v for k, v in os.environ.items() if k.startswith("COSPEC_")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
