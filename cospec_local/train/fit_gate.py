"""Give an arbiter a domain gate (cospec_local/arbiter/domain_gate.py) built from its tasks' prompts.

    python -m cospec_local.train.fit_gate --arbiter FOLDER --tasks FILE,FILE -m TARGET -md DRAFT --chat

A classifier gate (the default) learns the tasks' words against prompts the arbiter must stay
quiet on (general chat and the other task families), each prompt rendered in several formats (raw,
"Question:/Answer:", "User:/Assistant:" and, with --chat, the target's template) so that it admits
the tasks asked in other words and formats. `--kind coverage` builds the older bigram-coverage gate
(as the warm-up does), which admits only the training wording. Runs the engine only: never import
torch here.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..arbiter.domain_gate import build_gate, train_classifier_gate
from ..arbiter.file_format import INFO_FILE, add_gate
from ..command_line import REQUIRED, comma_list, option, parse_config
from ..engine import Engine
from ..recipes.distill_prompts import build_prompts
from ..tasks import TASKS, load_task
from ..tasks.short_answer import QA_FORMAT

KINDS = ("classifier", "coverage")
CHAT = "chat"  # general chat prompts (recipes/distill_prompts.py's train split) among --quiet-on
# Task families held out of every gate's negatives, so that staying quiet on them is measured, not taught.
HELD_OUT_FAMILIES = ("listops",)
# Formats a prompt is rendered in besides the target's chat template (--chat).
PLAIN_FORMATS = {"raw": "{}", "question": QA_FORMAT, "user": "User: {}\nAssistant:"}


def prompt_tokens(engine: Engine, prompts: list[str], chat: bool) -> list[list[int]]:
    if chat:
        return [engine.render_chat([{"role": "user", "content": p}]) for p in prompts]
    return [engine.tokenize(p) for p in prompts]


def in_formats(engine: Engine, prompts: list[str], chat: bool) -> list[list[int]]:
    """Every prompt in every format: raw text, two plain turn formats, and the chat template."""
    out = [engine.tokenize(form.format(p.strip())) for form in PLAIN_FORMATS.values() for p in prompts]
    return out + (prompt_tokens(engine, prompts, True) if chat else [])


@dataclass
class GateConfig:
    """A domain gate for an arbiter from its tasks' prompts (fit_gate.py's command line)."""

    arbiter: Path = option(REQUIRED, "The arbiter's folder (arbiter.gguf is rewritten).")
    tasks: str = option(REQUIRED, "Its training tasks, comma-separated (families or files).")
    model: str = option("demo-target", "Target model (its chat template, with --chat).", ("-m", "--model"))
    model_draft: str = option("demo-draft", "The draft the arbiter was made for.", ("-md", "--model-draft"))
    kind: str = option("classifier", "classifier (the tasks' words, across wording and format) or coverage "
                                     "(bigrams of the training wording).", choices=KINDS)
    quiet_on: str = option("chat,arith,pyfunc", "Classifier: what the gate must refuse, comma-separated: chat "
                                                "(general chat prompts) and task families (the arbiter's own are "
                                                "left out; listops never enters, so it stays a held-out check).")
    negatives: int = option(600, "Classifier: prompts of each kind in --quiet-on.")
    train: int = option(3000, "Train problems per task whose prompts the gate admits.")
    dev: int = option(300, "Dev problems per task: the gate's threshold is set on them.")
    chat: bool = option(False, "Prompts go through the target's chat template.")
    chat_template: str | None = option(None, "The target's chat template instead of its own (Jinja text or a "
                                             "name; with --chat).")
    chat_template_file: Path | None = option(None, "The same, read from a file.")


def negative_prompts(kinds: list[str], own: list[str], n: int) -> list[str]:
    out = []
    for kind in kinds:
        if kind in own or kind in HELD_OUT_FAMILIES:
            continue
        if kind == CHAT:
            out += build_prompts("train", n, 0)
        elif kind in TASKS:
            out += [p.prompt for p in load_task(kind, "train", n)]
        else:
            raise SystemExit(f"--quiet-on: {kind!r} is neither chat nor a task family ({sorted(TASKS)})")
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_config(GateConfig, argv, __doc__.split("\n\n")[0])
    tasks = comma_list(args.tasks)
    template = args.chat_template_file.read_text(encoding="utf-8") if args.chat_template_file else args.chat_template
    with Engine(args.model, args.model_draft, n_ctx=512, n_threads=1, calibration=None,
                **({"chat_template": template} if template else {})) as engine:
        train = [p.prompt for t in tasks for p in load_task(t, "train", args.train)]
        dev = [p.prompt for t in tasks for p in load_task(t, "dev", args.dev)]
        if args.kind == "coverage":
            gate = build_gate(prompt_tokens(engine, train, args.chat), prompt_tokens(engine, dev, args.chat),
                              engine.n_vocab)
            said = f"{len(gate.bigrams)} bigrams, threshold {gate.threshold:.3f} (dev coverage {json.dumps(gate.dev_coverage)})"
        else:
            quiet = negative_prompts(comma_list(args.quiet_on), tasks, args.negatives)
            dev_tokens = in_formats(engine, dev, args.chat)
            gate = train_classifier_gate(in_formats(engine, train, args.chat), in_formats(engine, quiet, args.chat),
                                         engine.n_vocab, dev=dev_tokens)
            if dev:
                gate.record["dev_admitted"] = float(np.mean([gate.admits(t) for t in dev_tokens]))
            gate.record["quiet_on"] = comma_list(args.quiet_on)
            said = f"classifier over {gate.record['positive']} task and {gate.record['negative']} other prompts: {json.dumps(gate.record)}"
    add_gate(args.arbiter, gate)
    info_file = args.arbiter / INFO_FILE
    if info_file.is_file():  # the record beside the arbiter's other measurements
        info = json.loads(info_file.read_text())
        info["gate"] = gate.record if args.kind == "classifier" else {"kind": "coverage", **gate.dev_coverage}
        info_file.write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
    print(f"{args.arbiter}: gate of {said}")


if __name__ == "__main__":
    main()
