"""What one call of a LoRA arbiter costs, with its adapter folded into a copy of the draft
(the default) and applied at every decode, on the blocks a generation really asks it about.

The blocks are recorded from speculative decoding of test problems by a function arbiter (it is
called where the walk reaches a mismatch, as a learned arbiter is). Each block is then scored by
both forms of the arbiter in turn, `--repeats` times, and the median time of a call is reported.
A call here is the draft's cache copied into the arbiter's context, the 2K-token region decoded,
and the head. (The first call on a block has the draft read the block's context, since its cache
holds the last generation; the median of the repeats leaves that out.) P(keep) of the two forms
is compared too.

    python bench/experiments/arbiter_pass.py --arbiter demo-lora --task arith --limit 150 -t 2

Run 2026-12-03 (bench/HISTORY.md, "The LoRA arbiter's adapter folded into the draft; adaptive
lengths that measure again", and its blocks in "Keeping arbiters against sps on a faster VM;
what the LoRA arbiter's pass is made of").
Kept as the record of that measurement, frozen: it is not maintained or tested and may not run
against today's code.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from cospec_local import Engine, _cospec, arbiter_from_function
from cospec_local.arbiter.catalog import resolve_arbiter_path
from cospec_local.tasks import FAMILY_STOPS, load_task


def record_blocks(engine: Engine, task: str, limit: int) -> list[dict]:
    blocks = []

    def record(block):
        blocks.append({k: np.array(v, copy=True) for k, v in block.items() if isinstance(v, np.ndarray)})
        return np.zeros(block["n_draft"], dtype=np.float32)

    recorder = arbiter_from_function(record, "recorder")
    for problem in load_task(task, "test", limit):
        engine.reset()
        engine.generate(problem.prompt, arbiter=recorder, max_tokens=256, stop=FAMILY_STOPS.get(task, ()))
    return blocks


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arbiter", default="demo-lora")
    ap.add_argument("--task", default="arith")
    ap.add_argument("--limit", type=int, default=150)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args(argv)

    with Engine.open_default(n_ctx=1024, n_threads=args.threads) as engine:
        blocks = record_blocks(engine, args.task, args.limit)
        path = str(resolve_arbiter_path(args.arbiter))
        forms = {"folded": _cospec.Arbiter.load(engine._native, path, fold_adapter=True),
                 "at decode": _cospec.Arbiter.load(engine._native, path, fold_adapter=False)}
        print(f"{len(blocks)} blocks asked about in {args.limit} {args.task} test problems; "
              f"forms: " + ", ".join(f"{k} ({a.meta('adapter_use')})" for k, a in forms.items()))
        per_form = {name: [] for name in forms}
        p = {name: [] for name in forms}
        for block in blocks:
            for name, arbiter in forms.items():  # alternating, so drift hits both alike
                p[name].append(arbiter.score(block)[block["mismatch"].astype(bool)])
                per_form[name].append(median_ms(lambda: arbiter.score(block), args.repeats))
        for name, ms in per_form.items():
            print(f"{name:>10}: {statistics.median(ms):.3f} ms a call (median over blocks), "
                  f"{statistics.mean(ms):.3f} ms mean")
        ratio = statistics.median(per_form["folded"]) / statistics.median(per_form["at decode"])
        print(f"folded / at decode: {ratio:.2f}")
        diff = np.abs(np.concatenate(p["folded"]) - np.concatenate(p["at decode"]))
        print(f"P(keep) folded vs at decode over {diff.size} mismatches: max |diff| {diff.max():.4f}, "
              f"median {np.median(diff):.5f}")


if __name__ == "__main__":
    main()
