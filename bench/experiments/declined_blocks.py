"""Adaptive drafting with a draft that declines its tokens (--draft-p-min), on the demo pair:
blocks, drafted tokens, plain steps and tokens/s for p-min 0, then a p-min that declines nearly
everything, then 0 again, and target-only, in one process (bench/HISTORY.md, "A draft that
declines its tokens").

    python bench/experiments/declined_blocks.py [--problems 20] [--threads 2]

Run 2026-12-02 (bench/HISTORY.md, "A draft that declines its tokens (`--draft-p-min`), adaptive
lengths").
Kept as the record of that measurement, frozen: it is not maintained or tested and may not run
against today's code.
"""
import argparse

from cospec_local import Engine
from cospec_local.tasks import load_task


def run(engine, problems, **settings):
    total = dict(tokens=0, blocks=0, drafted=0, plain=0, ms=0.0)
    for problem in problems:
        prompt = engine.render_chat([{"role": "user", "content": problem.prompt}])
        engine.reset()  # clears the caches; the tuner's estimates stay, as in a long session
        s = engine.generate(prompt, max_tokens=256, **settings).stats
        total["tokens"] += s.predicted_n
        total["blocks"] += s.blocks
        total["drafted"] += s.draft_n
        total["plain"] += s.plain
        total["ms"] += s.predicted_ms
    total["tok/s"] = round(1000 * total["tokens"] / total["ms"])
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=int, default=20, help="pyfunc test problems")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    with Engine.open_default(n_ctx=1024, n_threads=args.threads) as engine:
        problems = load_task("pyfunc", "test", args.problems)
        for p_min in (0.0, 0.9999999, 0.0):
            print(f"p-min {p_min}:", run(engine, problems, draft_p_min=p_min))
        print("target-only:", run(engine, problems, mode="target-only"))


if __name__ == "__main__":
    main()
