"""Ship a trained arbiter: copy its folder and record what it generates on a fixed subset.

    python -m cospec_local.train.bundle --arbiter runs/grpo-lora/best --out cospec_local/data/demo/arbiters/lora

Writes OUT (the arbiter's files) and OUT/reference.jsonl: greedy CoSpec generations of the first
problems of each family's test split (text, tokens, provenance, decisions), each from a clean
cache. A test regenerates them: the shipped files, the engine and the export agree exactly.
Runs the engine only: never import torch here.
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from ..arbiter_bundle import BUNDLE_FILES, REFERENCE_FILE
from ..engine import Engine
from ..params import GenerationParams
from ..tasks import FAMILY_STOPS, load_task
from .config import HelpFormatter

# Per family: the shipped arbiters keep a draft token only past the 8th test problem.
REFERENCE_PROBLEMS = 16


def reference_runs(engine: Engine, arbiter: str, families=("arith", "pyfunc"), n: int = REFERENCE_PROBLEMS,
                   max_tokens: int = 256) -> list[dict]:
    params = GenerationParams(max_tokens=max_tokens, arbiter=arbiter)
    rows = []
    for family in families:
        for problem in load_task(family, "test", n):
            engine.reset()
            run = engine.generate(problem.prompt, params, stop=tuple(FAMILY_STOPS.get(family, ())))
            rows.append({"problem_id": problem.id, "family": family, "text": run.text, "tokens": run.tokens,
                         "provenance": run.provenance,
                         "decisions": [[d.block, d.position, d.token_index, d.keep] for d in run.decisions]})
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    ap.add_argument("--arbiter", required=True, type=Path, help="The trained arbiter's folder (e.g. a run's best/).")
    ap.add_argument("--out", required=True, type=Path, help="Where the arbiter ships.")
    ap.add_argument("-m", "--model", default="demo-target", help="Target model (named or GGUF path).")
    ap.add_argument("-md", "--model-draft", default="demo-draft", help="Draft model (named or GGUF path).")
    ap.add_argument("--n", type=int, default=REFERENCE_PROBLEMS, help="Reference problems per family.")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in BUNDLE_FILES:
        if (args.arbiter / name).is_file() and args.arbiter.resolve() != args.out.resolve():
            shutil.copyfile(args.arbiter / name, args.out / name)
    with Engine(args.model, args.model_draft, n_ctx=1024, n_threads=1) as engine:
        rows = reference_runs(engine, str(args.out), n=args.n)
    (args.out / REFERENCE_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    kept = sum(p == "kept" for r in rows for p in r["provenance"])
    print(f"{args.out}: {len(rows)} reference generations, {kept} draft tokens kept")


if __name__ == "__main__":
    main()
