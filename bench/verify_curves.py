"""What verifying n tokens costs on this CPU, in single-token steps, with llama.cpp's weight
repacking on and off, per model: the engine's own curve (every row's logits, as a verify needs
them; `cospec-local calibrate` measures the same) beside llama-bench's at its defaults (a prompt
batch computes the last row's logits alone), built from the vendored source against the very
libraries the engine runs. Their gap is what a verify's output rows cost.

    python bench/verify_curves.py -m gemma3-270m smollm2-135m smollm2-135m-q4_0-as-1b -t 2 --out DIR

Models: GGUF files or named models. Prints one row per model and setting; with --out writes
results.json and results.md.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from ngram_vs_llama_cpp import build_llama_tool  # noqa: E402
from results_report import command, report  # noqa: E402

# Tokens per verify batch: K drafted + 1, for K = 1, 2, 4, 8, 16.
BATCHES = (2, 3, 5, 9, 17)


def build_llama_bench(out_dir: Path) -> Path:
    return build_llama_tool(out_dir, "llama-bench", ["tools/llama-bench/llama-bench.cpp", "tools/llama-bench/main.cpp"])


def llama_bench_curve(binary: Path, model: Path, threads: int, repack: bool, repeats: int) -> dict:
    """llama-bench's single-token time (tg) and each batch's time in those steps."""
    sizes = ",".join(str(n) for n in (1, *BATCHES))
    out = subprocess.run([str(binary), "-m", str(model), "-p", sizes, "-n", "32", "-t", str(threads),
                          "--repack", "1" if repack else "0", "-r", str(repeats), "-o", "json"],
                         capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"llama-bench failed:\n{out.stderr[-2000:]}")
    rows = json.loads(out.stdout)
    step_ms = next(1000.0 / r["avg_ts"] for r in rows if r["n_gen"] > 0)
    batch_ms = {r["n_prompt"]: 1000.0 * r["n_prompt"] / r["avg_ts"] for r in rows if r["n_prompt"] > 0}
    return {"step_ms": step_ms, "verify": {n: batch_ms[n] / step_ms for n in BATCHES}}


def engine_curve(model: Path, threads: int, repack: bool) -> dict:
    """The engine's single-token step and each verify's time in steps (its calibration's costs)."""
    from cospec_local import Engine, calibration

    with Engine(model, n_threads=threads, calibration=None, repack=repack) as engine:
        measured = calibration.measure_costs(engine)
        repacked = engine.repacked_bytes["target"]
    numbers = measured.numbers
    return {"step_ms": numbers["target_step_ms"], "verify": {n: numbers["verify"][n - 1] for n in BATCHES},
            "repacked_bytes": repacked, "other_load": measured.other_load}


def main(argv=None) -> int:
    from cospec_local.evaluation.machine import OtherLoad
    from cospec_local.models import resolve_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--models", nargs="+", required=True, help="GGUF files or named models")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repeats", type=int, default=5, help="llama-bench's repetitions of each test")
    ap.add_argument("--llama-bin", type=Path, default=REPO / "build" / "llama-tools",
                    help="where llama-bench is built (once)")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    binary = build_llama_bench(a.llama_bin)
    heads = " / ".join(str(n) for n in BATCHES)
    cmd = command("verify_curves.py", argv)
    lines = [f"# Verify costs in single-token steps, {heads} tokens; {a.threads} threads", "", f"`{' '.join(cmd)}`", "",
             f"| model | repacking | repacked MB | engine: ms a token | engine: {heads} (every row's logits) | "
             f"llama-bench: ms a token | llama-bench: {heads} (last row's) |",
             "|---|---|---|---|---|---|---|"]
    rows = []
    with OtherLoad() as load:
        for name in a.models:
            model = resolve_model(name)
            for repack in (True, False):
                ours = engine_curve(model, a.threads, repack)
                theirs = llama_bench_curve(binary, model, a.threads, repack, a.repeats)
                rows.append({"model": name, "file": model.name, "repack": repack, "engine": ours, "llama_bench": theirs})
                lines.append(f"| {name} | {'on' if repack else 'off'} | {ours['repacked_bytes'] / 2**20:.0f} | "
                             f"{ours['step_ms']:.1f} | {' / '.join(f'{v:.2f}' for v in ours['verify'].values())} | "
                             f"{theirs['step_ms']:.1f} | {' / '.join(f'{v:.2f}' for v in theirs['verify'].values())} |")
    report(lines, cmd, a.out, load.share, threads=a.threads, batches=list(BATCHES),
           rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
