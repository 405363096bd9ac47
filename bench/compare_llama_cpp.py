"""Compare the sps loop with llama.cpp's own `llama-speculative-simple` on the
same models, K, threads, offload and prompt (flash attention: each program's
default, or -fa for both), alternating runs so machine noise hits both. Both
draft exactly K tokens per block (our adaptive length is off), from the draft model alone: the
engine runs `--spec-type draft` beside llama.cpp's `draft-simple` (its default `auto` would add the
n-gram drafter, which llama-speculative-simple does not run there).

Build llama-speculative-simple from the llama.cpp source that llama-cpp-python
0.3.36 vendors (its sdist's vendor/llama.cpp), with the same GGML flags as the
install (e.g. -DGGML_CUDA=on), then:

    python bench/compare_llama_cpp.py --llama-bin BUILD/bin -m TARGET -md DRAFT --draft-max 4 [-ngl 99]

TARGET and DRAFT are GGUF files or named models (`cospec-local models`).
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys

from cospec_local.models import resolve_model

PROMPT = "Once upon a time, in a small village by the sea,"


def run_llama(bin_dir, target, draft, k, n, threads, ngl, fa):
    cmd = [f"{bin_dir}/llama-speculative-simple", "-m", target, "-md", draft, "-p", PROMPT, "-n", str(n),
           "--spec-type", "draft-simple", "--spec-draft-n-max", str(k), "--temp", "0", "--top-k", "1",
           "-t", str(threads), "-td", str(threads), "-c", "4096", "--draft-p-min", "0",
           "-ngl", str(ngl), "-ngld", str(ngl)] + (["-fa", fa] if fa else [])
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s", out.stderr + out.stdout)
    acc = re.search(r"accept\s+=\s+([\d.]+)%", out.stderr + out.stdout)
    if not m:
        sys.exit("llama-speculative-simple failed:\n" + out.stderr[-3000:])
    return {"tokens": int(m.group(1)), "seconds": float(m.group(2)), "tps": float(m.group(3)),
            "acceptance": float(acc.group(1)) / 100 if acc else None}


def run_cospec(target, draft, k, n, threads, ngl, fa):
    cmd = [sys.executable, "-m", "cospec_local.cli", "generate", "-m", target, "-md", draft, "-p", PROMPT,
           "-n", str(n), "--mode", "speculative", "--spec-type", "draft", "--arbiter", "target", "--draft-max", str(k),
           "--fixed-draft", "-t", str(threads), "-c", "4096",
           "-ngl", str(ngl), "-ngld", str(ngl), "--json"] + (["-fa", fa] if fa else [])
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        sys.exit("cospec-local failed:\n" + out.stderr[-3000:])
    s = json.loads(out.stdout)["stats"]
    return {"tokens": s["predicted_n"], "seconds": s["predicted_ms"] / 1000, "tps": s["predicted_per_second"],
            "acceptance": s["acceptance_rate"],
            "outside_llama": 1 - (s["draft_ms"] + s["verify_ms"]) / s["predicted_ms"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-bin", required=True)
    ap.add_argument("-m", required=True)
    ap.add_argument("-md", required=True)
    ap.add_argument("--draft-max", type=int, default=4)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("-ngl", type=int, default=0, help="layers to offload, the same for target and draft (0: CPU)")
    ap.add_argument("-fa", "--flash-attn", choices=("on", "off", "auto"), default=None,
                    help="flash attention for both programs (default: each program's own default; ours turns "
                         "it off for small models on the CPU, llama.cpp's auto turns it on there)")
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    fa = a.flash_attn
    target, draft = str(resolve_model(a.m)), str(resolve_model(a.md))
    llama, ours = [], []
    for _ in range(a.runs):
        llama.append(run_llama(a.llama_bin, target, draft, a.draft_max, a.n, a.t, a.ngl, fa))
        ours.append(run_cospec(target, draft, a.draft_max, a.n, a.t, a.ngl, fa))
    med = lambda rows, key: statistics.median(r[key] for r in rows)
    print(json.dumps({"target": a.m, "draft": a.md, "draft_max": a.draft_max, "threads": a.t, "ngl": a.ngl,
                      "flash_attn": fa or "each program's default", "runs": a.runs,
                      "llama_speculative_simple": {"tps_median": med(llama, "tps"), "runs": llama},
                      "cospec_sps": {"tps_median": med(ours, "tps"), "runs": ours},
                      "ratio_cospec_over_llama": med(ours, "tps") / med(llama, "tps")}, indent=1))


if __name__ == "__main__":
    main()
