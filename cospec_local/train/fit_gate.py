"""Give an arbiter a domain gate (cospec_local/arbiter/domain_gate.py) built from its tasks' prompts.

    python -m cospec_local.train.fit_gate --arbiter FOLDER --tasks FILE,FILE -m TARGET -md DRAFT --chat

A classifier gate (the default for a user's own tasks) learns the tasks' words against prompts
the arbiter must stay quiet on (general chat and the other task families), each prompt rendered in several formats (raw,
"Question:/Answer:", "User:/Assistant:" and, with --chat, the target's template) so that it admits
the tasks asked in other words and formats. `--kind coverage` builds the older bigram-coverage gate
(as the warm-up does), which admits only the training wording.

`--kind checkable` (what `arbiter train` gives an arbiter of the built-in short-answer families)
asks "is this a question with a short, checkable answer?" rather than "is this one of my tasks?":
an embedding gate over the draft's hidden state of the prompt, trained on the tasks' questions
alone (without their drawn format) in every format against general chat and long-form writing only. Other checkable tasks are never its negatives, so that it admits
short-answer families it never saw (bench/gate_leave_family_out.py measures that, one family left
out at a time). Runs the engine only: never import torch here.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..arbiter.domain_gate import build_gate, train_classifier_gate, train_embedding_gate
from ..arbiter.file_format import INFO_FILE, add_gate
from ..command_line import REQUIRED, comma_list, option, parse_config
from ..engine import Engine
from ..recipes.distill_prompts import build_prompts
from ..recipes.distill_prompts import HELDOUT_TOPICS, TOPICS
from ..tasks import SHORT_ANSWER_FAMILIES, TASKS, load_task
from ..tasks.short_answer import QA_FORMAT, bare_question

KINDS = ("classifier", "checkable", "coverage")
CHECKABLE = "checkable"
CHAT = "chat"  # general chat prompts (recipes/distill_prompts.py's train split) among --quiet-on
# Task families held out of every gate's negatives, so that staying quiet on them is measured, not taught.
HELD_OUT_FAMILIES = ("listops",)
# Formats a prompt is rendered in besides the target's chat template (--chat).
PLAIN_FORMATS = {"raw": "{}", "question": QA_FORMAT, "user": "User: {}\nAssistant:"}
FORMAT_NAMES = (*PLAIN_FORMATS, "chat")
# Long-form writing a checkable-answer gate stays shut on, beside general chat: one set to train
# on, and one of other templates and topics (distill_prompts' held-out topics) to measure it with.
LONG_FORM = ["Write an essay about {t}.", "Write a blog post about {t}.", "Write a short story about {t}.",
             "Draft an email to a colleague about {t}.", "Write a detailed explanation of {t} with examples.",
             "Write a speech about {t} for a school assembly.", "Write a product description related to {t}.",
             "Write a letter to a friend describing {t}."]
LONG_FORM_HELDOUT = ["Compose a five-paragraph report on {t}.", "Write a diary entry about a day spent with {t}.",
                     "Draft a newsletter article about {t}.", "Write a persuasive op-ed about {t}.",
                     "Write a bedtime story featuring {t}."]
# Questions per task a checkable-answer gate learns from (each in four formats): it learns what such
# a question is, not a task's words, so a few wordings of many tasks count for more than many of one.
CHECKABLE_QUESTIONS = 60
NEGATIVES_PER_KIND = 300  # general chat prompts, and long-form ones, a checkable-answer gate learns from


def prompt_tokens(engine: Engine, prompts: list[str], chat: bool) -> list[list[int]]:
    if chat:
        return [engine.render_chat([{"role": "user", "content": p}]) for p in prompts]
    return [engine.tokenize(p) for p in prompts]


def in_each_format(engine: Engine, prompts: list[str], chat: bool = True) -> dict[str, list[list[int]]]:
    """Every prompt in each of FORMAT_NAMES (the chat template only with `chat`), by format."""
    out = {name: [engine.tokenize(form.format(p.strip())) for p in prompts] for name, form in PLAIN_FORMATS.items()}
    return out | ({"chat": prompt_tokens(engine, prompts, True)} if chat else {})


def in_formats(engine: Engine, prompts: list[str], chat: bool) -> list[list[int]]:
    """Every prompt in every format: raw text, two plain turn formats, and the chat template."""
    return [t for toks in in_each_format(engine, prompts, chat).values() for t in toks]


def long_form_prompts(templates: list[str], topics: list[str]) -> list[str]:
    names = [" ".join(t.split()) for t in topics if t.strip()]
    return [tmpl.format(t=t) for t in names for tmpl in templates]


def held_out_quiet_prompts(n: int = 100) -> dict[str, list[str]]:
    """Chat and long-form prompts of templates and topics no gate trains on."""
    return {"chat": build_prompts("heldout", n, 0), "long-form": long_form_prompts(LONG_FORM_HELDOUT, HELDOUT_TOPICS)[:n]}


def embeddings(engine: Engine, prompts: list[list[int]]) -> np.ndarray:
    """The draft's hidden state at each prompt's last token (target tokens), what an embedding gate reads."""
    return np.array([engine.prompt_embedding(t) for t in prompts], dtype=np.float32)


def general_negatives(engine: Engine, n: int = NEGATIVES_PER_KIND) -> np.ndarray:
    """What a checkable-answer gate stays shut on: general chat and long-form writing, in every
    format, as the draft reads them."""
    prompts = build_prompts("train", n, 0) + long_form_prompts(LONG_FORM, TOPICS)[:n]
    return embeddings(engine, in_formats(engine, prompts, True))


def task_questions(task: str, split: str, n: int) -> list[str]:
    """A task's questions without their drawn format (the short-answer families'), its prompts otherwise."""
    return [bare_question(p) for p in load_task(task, split, n)]


def task_embeddings(engine: Engine, task: str, split: str, n: int, cache: dict | None = None) -> np.ndarray:
    """A task's questions in every format as the draft reads them (kept in `cache` where given)."""
    key = (task, split, n)
    if cache is None or key not in cache:
        found = embeddings(engine, in_formats(engine, task_questions(task, split, n), True))
        if cache is None:
            return found
        cache[key] = found
    return cache[key]


def general_gate(engine: Engine, tasks: list[str], negatives: np.ndarray, train: int = CHECKABLE_QUESTIONS,
                 dev: int = CHECKABLE_QUESTIONS // 3, cache: dict | None = None):
    """A checkable-answer gate (an EmbeddingGate): the tasks' questions in every format against
    `negatives` (general_negatives)."""
    positive = np.vstack([task_embeddings(engine, t, "train", train, cache) for t in tasks])
    dev_rows = np.vstack([task_embeddings(engine, t, "dev", dev, cache) for t in tasks])
    gate = train_embedding_gate(positive, negatives, dev_rows)
    gate.record.update(kind=CHECKABLE, tasks=list(tasks))
    return gate


def default_gate_kind(tasks: list[str]) -> str:
    """checkable for an arbiter of any built-in short-answer family (the general mix), else classifier."""
    return CHECKABLE if any(t in {f.name for f in SHORT_ANSWER_FAMILIES} for t in tasks) else "classifier"


@dataclass
class GateConfig:
    """A domain gate for an arbiter from its tasks' prompts (fit_gate.py's command line)."""

    arbiter: Path = option(REQUIRED, "The arbiter's folder (arbiter.gguf is rewritten).")
    tasks: str = option(REQUIRED, "Its training tasks, comma-separated (families or files).")
    model: str = option("demo-target", "Target model (its chat template, with --chat).", ("-m", "--model"))
    model_draft: str = option("demo-draft", "The draft the arbiter was made for.", ("-md", "--model-draft"))
    kind: str = option("classifier", "classifier (the tasks' words, across wording and format), checkable (a "
                                     "question with a short, checkable answer, against chat and long-form writing: "
                                     "admits such tasks it never saw) or coverage (bigrams of the training wording).",
                       choices=KINDS)
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
        if args.kind == CHECKABLE:
            gate = general_gate(engine, tasks, general_negatives(engine, args.negatives),
                                min(args.train, CHECKABLE_QUESTIONS), min(args.dev, CHECKABLE_QUESTIONS // 3))
            said = f"a question with a checkable answer, over {gate.record['positive']} task and {gate.record['negative']} other prompts: {json.dumps(gate.record)}"
        elif args.kind == "coverage":
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
        info["gate"] = gate.record if args.kind != "coverage" else {"kind": "coverage", **gate.dev_coverage}
        info_file.write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
    print(f"{args.arbiter}: gate of {said}")


if __name__ == "__main__":
    main()
