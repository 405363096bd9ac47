"""Draft-free speculation on input-grounded prompts (copying, editing, reformatting, extraction,
code edits: bench/grounded_prompts.jsonl): the engine's n-gram drafter (`--spec-type ngram`)
against target-only decoding and against each of llama.cpp's n-gram kinds in its own
`llama-speculative-simple --spec-type KIND`, built from the vendored source against the very
libraries the engine runs. Same target, raw prompts, greedy, the same number of tokens
(end-of-text ignored), the same threads; prompts in turn, each program's runs beside each other.

    python bench/ngram_vs_llama_cpp.py -m smollm2-135m-as-1b -n 160 -t 2 --out bench/ngram_grounded

Prints per-prompt tokens/s and the geometric means of the ratios, checks every n-gram output
against target-only's tokens, and with --out writes results.json and results.md.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from results_report import command, report  # noqa: E402
LLAMA_KINDS = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")


def build_llama_tool(out_dir: Path, name: str, sources: list[str]) -> Path:
    """One of llama.cpp's tools (its `sources`, relative to the vendored source .venv/src/llama.cpp)
    linked against llama-cpp-python's installed libraries (llama.cpp's own common/ included), with
    llama_log_flush.cpp so that its last log lines survive exit: seconds."""
    import llama_cpp

    from cospec_local.formats.tiny_models import llama_cpp_source

    binary = out_dir / name
    if binary.is_file():
        return binary
    site = Path(llama_cpp.__file__).resolve().parents[1]
    src = llama_cpp_source()
    out_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(["g++", "-O2", "-std=c++17", "-I", str(src / "common"), "-I", str(src / "vendor"),
                    "-I", str(site / "include"), *(str(src / f) for f in sources),
                    str(REPO / "bench/llama_log_flush.cpp"), "-o", str(binary), "-L", str(site / "lib"), "-lllama-common", "-lllama", "-lggml",
                    "-lggml-base", f"-Wl,--disable-new-dtags,-rpath,{site / 'lib'}"], check=True)
    return binary


def build_speculative_simple(out_dir: Path) -> Path:
    """llama.cpp's llama-speculative-simple (build_llama_tool)."""
    return build_llama_tool(out_dir, "llama-speculative-simple", ["examples/speculative-simple/speculative-simple.cpp"])


def run_speculative_simple(binary: Path, args: list[str], kind: str) -> dict:
    """Run llama-speculative-simple with `args` (after the binary) and read its speed, acceptance and
    counts of drafted and accepted tokens."""
    # errors="replace": a random model's text is not valid UTF-8
    out = subprocess.run([str(binary), *args], capture_output=True, text=True, errors="replace", timeout=900)
    text = out.stdout + out.stderr
    speed = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s", text)
    accept = re.search(r"accept\s+=\s+([\d.]+)%", text)
    counts = dict(re.findall(r"(n_drafted|n_accept)\s+=\s+(\d+)", text))
    if out.returncode != 0 or not speed:
        raise RuntimeError(f"llama-speculative-simple --spec-type {kind} failed:\n{text[-2000:]}")
    return {"tps": float(speed.group(3)), "tokens": int(speed.group(1)),
            "acceptance": float(accept.group(1)) / 100 if accept else None,
            "drafted": int(counts.get("n_drafted", 0)), "accepted": int(counts.get("n_accept", 0))}


def run_llama(binary: Path, target: Path, prompt: str, kind: str, n: int, threads: int) -> dict:
    return run_speculative_simple(binary, ["-m", str(target), "-p", prompt, "--spec-type", kind, "-n", str(n),
                                           "--temp", "0", "--top-k", "1", "--ignore-eos", "-t",
                                           str(threads), "-c", "4096"], kind)


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def main(argv=None) -> int:
    from cospec_local import Engine
    from cospec_local.evaluation.machine import OtherLoad
    from cospec_local.models import resolve_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="smollm2-135m-as-1b")
    ap.add_argument("-n", type=int, default=160)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--prompts", type=Path, default=REPO / "bench" / "grounded_prompts.jsonl")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--kinds", default=",".join(LLAMA_KINDS), help="llama.cpp's kinds to run (comma list)")
    ap.add_argument("--llama-bin", type=Path, default=REPO / ".cache" / "llama-bin")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    kinds = [k for k in a.kinds.split(",") if k]
    prompts = [json.loads(line) for line in a.prompts.read_text().splitlines() if line.strip()][: a.limit]
    binary = build_speculative_simple(a.llama_bin)
    target = resolve_model(a.model)
    rows = []
    load = OtherLoad()
    started = time.time()
    with Engine(target, None, n_ctx=4096, n_threads=a.threads) as engine:
        engine.generate("Warm up.", max_tokens=8, mode="target-only")
        for i, p in enumerate(prompts):
            with load.window():
                plain = engine.generate(p["prompt"], max_tokens=a.n, mode="target-only", ignore_eos=True)
                ngram = engine.generate(p["prompt"], max_tokens=a.n, spec_type="ngram", ignore_eos=True)
            s = ngram.stats
            at = next((j for j, (x, y) in enumerate(zip(ngram.tokens, plain.tokens)) if x != y), None)
            near_tie = None
            if at is not None:
                # Where the output leaves target-only's, how close the target's two likeliest tokens
                # were there (teacher-forced): batched verification rounds near-ties its own way.
                row_logits = engine.score(engine.tokenize(p["prompt"]) + plain.tokens[:at])[-1]
                top2 = sorted(row_logits)[-2:]
                near_tie = {"position": at, "top2_margin": float(top2[1] - top2[0])}
            engine.reset()  # the next prompt's n-gram pool holds its own text alone
            row = {"kind": p["kind"], "target_only_tps": plain.stats.predicted_per_second, "difference": near_tie,
                   "ngram_tps": s.predicted_per_second, "identical": ngram.tokens == plain.tokens,
                   "ngram_drafted": s.draft_n_ngram, "ngram_accepted": s.draft_n_matched_ngram,
                   "llama": {k: run_llama(binary, target, p["prompt"], k, a.n, a.threads) for k in kinds}}
            rows.append(row)
            best = max(row["llama"].items(), key=lambda kv: kv[1]["tps"])
            print(f"{i + 1:2d} {p['kind']:<20} target-only {row['target_only_tps']:6.1f}  ngram {row['ngram_tps']:6.1f} "
                  f"({row['ngram_tps'] / row['target_only_tps']:.2f}x, accepted {s.draft_n_matched_ngram}/"
                  f"{s.draft_n_ngram}, {'same' if row['identical'] else 'DIFFERENT'})  llama.cpp best {best[0]} "
                  f"{best[1]['tps']:6.1f}", flush=True)
    summary = {
        "ngram_over_target_only": geomean([r["ngram_tps"] / r["target_only_tps"] for r in rows]),
        "llama_over_target_only": {k: geomean([r["llama"][k]["tps"] / r["target_only_tps"] for r in rows])
                                   for k in kinds},
        "ngram_over_llama": {k: geomean([r["ngram_tps"] / r["llama"][k]["tps"] for r in rows]) for k in kinds},
        "identical": sum(r["identical"] for r in rows), "prompts": len(rows),
    }
    best_kind = max(kinds, key=lambda k: summary["llama_over_target_only"][k])
    summary["best_llama_kind"] = best_kind
    cmd = command("ngram_vs_llama_cpp.py", argv)
    lines = [f"# N-gram drafting on {len(rows)} input-grounded prompts",
             "", f"`{' '.join(cmd)}`", "",
             f"Target {a.model}, raw prompts, greedy, {a.n} tokens (end-of-text ignored), {a.threads} threads; "
             f"geometric means of per-prompt ratios of generation tokens/s.", "",
             "| run | x target-only | engine's ngram over it |", "|---|---|---|",
             f"| engine `--spec-type ngram` | {summary['ngram_over_target_only']:.2f}x | |"]
    lines += [f"| llama-speculative-simple `--spec-type {k}` | {summary['llama_over_target_only'][k]:.2f}x | "
              f"{summary['ngram_over_llama'][k]:.2f}x |" for k in kinds]
    margins = ", ".join(f"{r['difference']['top2_margin']:.3f}" for r in rows if r["difference"] is not None)
    lines += ["", f"Outputs identical to target-only: {summary['identical']} of {len(rows)}"
              + (f"; the others leave it at a near-tie of the target (top-2 logit margins {margins})"
                 if margins else "") + ".",
              f"Best llama.cpp kind: {best_kind}."]
    report(lines, cmd, a.out, load.share, model=a.model, n=a.n, threads=a.threads, seconds=time.time() - started,
           summary=summary, rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
