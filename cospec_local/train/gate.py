"""Give an arbiter a domain gate (cospec_local/domain_gate.py) built from its tasks' prompts.

    python -m cospec_local.train.gate --arbiter FOLDER --tasks arith,pyfunc --train 3000 --dev 300

The warm-up builds the gate itself from the prompts its states were collected on; this is for an
arbiter made before the gate existed (the shipped demo arbiters got theirs this way). The prompts
are tokenized as the engine sees them at the start of a generation (raw, or through the target's
chat template with --chat). Runs the engine only: never import torch here.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..arbiter_bundle import add_gate
from ..domain_gate import build_gate
from ..engine import Engine
from ..tasks import load_task
from .config import HelpFormatter


def prompt_tokens(engine: Engine, prompts: list[str], chat: bool) -> list[list[int]]:
    if chat:
        return [engine.render_chat([{"role": "user", "content": p}]) for p in prompts]
    return [engine.tokenize(p) for p in prompts]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    ap.add_argument("--arbiter", required=True, type=Path, help="The arbiter's folder (arbiter.gguf is rewritten).")
    ap.add_argument("--tasks", required=True, help="Its training tasks, comma-separated (families or files).")
    ap.add_argument("-m", "--model", default="demo-target", help="Target model (its chat template, with --chat).")
    ap.add_argument("-md", "--model-draft", default="demo-draft", help="The draft the arbiter was made for.")
    ap.add_argument("--train", type=int, default=3000, help="Train problems per task whose prompts the gate admits.")
    ap.add_argument("--dev", type=int, default=300, help="Dev problems per task: the threshold is set on them.")
    ap.add_argument("--chat", action="store_true", help="Prompts go through the target's chat template.")
    args = ap.parse_args(argv)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    with Engine(args.model, args.model_draft, n_ctx=512, n_threads=1) as engine:
        train = prompt_tokens(engine, [p.prompt for t in tasks for p in load_task(t, "train", args.train)], args.chat)
        dev = prompt_tokens(engine, [p.prompt for t in tasks for p in load_task(t, "dev", args.dev)], args.chat)
        gate = build_gate(train, dev, engine.n_vocab)
    add_gate(args.arbiter, gate)
    print(f"{args.arbiter}: gate of {len(gate.bigrams)} bigrams, threshold {gate.threshold:.3f} "
          f"(dev coverage {json.dumps(gate.dev_coverage)})")


if __name__ == "__main__":
    main()
