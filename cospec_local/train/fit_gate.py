"""Give an arbiter a domain gate (cospec_local/arbiter/domain_gate.py) built from its tasks' prompts.

    python -m cospec_local.train.fit_gate --arbiter FOLDER --tasks arith,pyfunc --train 3000 --dev 300

The warm-up builds the gate itself from the prompts its states were collected on; this is for an
arbiter made before the gate existed (the shipped demo arbiters got theirs this way). The prompts
are tokenized as the engine sees them at the start of a generation (raw, or through the target's
chat template with --chat). Runs the engine only: never import torch here.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..arbiter.file_format import add_gate
from ..arbiter.domain_gate import build_gate
from ..engine import Engine
from ..tasks import load_task
from ..command_line import REQUIRED, comma_list, option, parse_config


def prompt_tokens(engine: Engine, prompts: list[str], chat: bool) -> list[list[int]]:
    if chat:
        return [engine.render_chat([{"role": "user", "content": p}]) for p in prompts]
    return [engine.tokenize(p) for p in prompts]


@dataclass
class GateConfig:
    """A domain gate for an arbiter from its tasks' prompts (fit_gate.py's command line)."""

    arbiter: Path = option(REQUIRED, "The arbiter's folder (arbiter.gguf is rewritten).")
    tasks: str = option(REQUIRED, "Its training tasks, comma-separated (families or files).")
    model: str = option("demo-target", "Target model (its chat template, with --chat).", ("-m", "--model"))
    model_draft: str = option("demo-draft", "The draft the arbiter was made for.", ("-md", "--model-draft"))
    train: int = option(3000, "Train problems per task whose prompts the gate admits.")
    dev: int = option(300, "Dev problems per task: the threshold is set on them.")
    chat: bool = option(False, "Prompts go through the target's chat template.")


def main(argv: list[str] | None = None) -> None:
    args = parse_config(GateConfig, argv, __doc__.split("\n\n")[0])
    tasks = comma_list(args.tasks)
    with Engine(args.model, args.model_draft, n_ctx=512, n_threads=1) as engine:
        train = prompt_tokens(engine, [p.prompt for t in tasks for p in load_task(t, "train", args.train)], args.chat)
        dev = prompt_tokens(engine, [p.prompt for t in tasks for p in load_task(t, "dev", args.dev)], args.chat)
        gate = build_gate(train, dev, engine.n_vocab)
    add_gate(args.arbiter, gate)
    print(f"{args.arbiter}: gate of {len(gate.bigrams)} bigrams, threshold {gate.threshold:.3f} "
          f"(dev coverage {json.dumps(gate.dev_coverage)})")


if __name__ == "__main__":
    main()
