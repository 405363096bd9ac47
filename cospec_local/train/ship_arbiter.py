"""Ship a trained arbiter: copy its folder and record what it generates on a fixed subset.

    python -m cospec_local.train.ship_arbiter --arbiter runs/grpo-lora/best --out cospec_local/data/demo/arbiters/lora
    python -m cospec_local.train.ship_arbiter --arbiter ARBITER --out cospec_local/data/smollm2-arith/arbiters/features \
        -m smollm2-135m -md smollm2-135m-arith-draft --tasks cospec_local/data/smollm2-arith/arithmetic.jsonl --chat

Writes OUT (the arbiter's files) and OUT/reference.jsonl: greedy CoSpec generations of the first
problems of each task's test split (text, tokens, provenance, decisions), each from a clean
cache. A test regenerates them: the shipped files, the engine and the export agree exactly.
Runs the engine only: never import torch here.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from .. import _cospec
from ..arbiter.file_format import BUNDLE_FILES, REFERENCE_FILE, REFERENCE_REPACK, kernel_reference_file
from ..engine import Engine
from ..params import GenerationParams
from ..evaluation.task_eval import task_draft_prompt, task_prompt
from ..tasks import load_task
from ..command_line import REQUIRED, comma_list, option, parse_config

# Per family: the shipped arbiters keep a draft token only past the 8th test problem.
REFERENCE_PROBLEMS = 16


def reference_runs(engine: Engine, arbiter: str, tasks=("arith", "pyfunc"), n: int = REFERENCE_PROBLEMS,
                   max_tokens: int = 256, chat: bool = False) -> list[dict]:
    # The draft model alone drafts (the n-gram drafter's lengths follow the machine's calibration):
    # the arbiter's blocks then follow its recorded cost model only, the same on any machine.
    params = GenerationParams(max_tokens=max_tokens, arbiter=arbiter, spec_type="draft")
    rows = []
    for task in tasks:
        for problem in load_task(task, "test", n):
            prompt, stop = task_prompt(engine, problem, chat)
            engine.reset()
            run = engine.generate(prompt, params, stop=stop, draft_prompt=task_draft_prompt(engine, problem, chat))
            rows.append({"problem_id": problem.id, "family": problem.family, "text": run.text, "tokens": run.tokens,
                         "provenance": run.provenance,
                         "decisions": [[d.block, d.position, d.token_index, d.keep] for d in run.decisions]})
    return rows


@dataclass
class BundleConfig:
    """Ship a trained arbiter with its reference generations (ship_arbiter.py's command line)."""

    arbiter: Path = option(REQUIRED, "The trained arbiter's folder (e.g. a run's best/).")
    out: Path = option(REQUIRED, "Where the arbiter ships.")
    model: str = option("demo-target", "Target model (named or GGUF path).", ("-m", "--model"))
    model_draft: str = option("demo-draft", "Draft model (named or GGUF path).", ("-md", "--model-draft"))
    n: int = option(REFERENCE_PROBLEMS, "Reference problems per task.")
    tasks: str = option("arith,pyfunc", "Task families or files, comma-separated.")
    chat: bool = option(False, "Through the target's chat template.")
    max_tokens: int = option(256, "Most tokens per reference generation.")
    chat_template_file: Path | None = option(None, "The target's chat template instead of its own (a base model's "
                                                   "question/answer form).")
    threads: int = option(1, "Threads of the engine that writes them (the test reruns them with as many).")
    this_cpu: bool = option(False, "Write them as this CPU's kernel family's (reference.avx2.jsonl on an AVX2 "
                                   "CPU), beside reference.jsonl, whose greedy tokens another family's kernels "
                                   "round otherwise at near-ties.")


def main(argv: list[str] | None = None) -> None:
    args = parse_config(BundleConfig, argv, __doc__.split("\n\n")[0])
    args.out.mkdir(parents=True, exist_ok=True)
    for name in BUNDLE_FILES:
        if (args.arbiter / name).is_file() and args.arbiter.resolve() != args.out.resolve():
            shutil.copyfile(args.arbiter / name, args.out / name)
    template = args.chat_template_file.read_text(encoding="utf-8") if args.chat_template_file else None
    with Engine(args.model, args.model_draft, n_ctx=1024, n_threads=args.threads, chat_template=template,
                calibration=None, repack=REFERENCE_REPACK) as engine:
        rows = reference_runs(engine, str(args.out), comma_list(args.tasks), args.n,
                              max_tokens=args.max_tokens, chat=args.chat)
    name = kernel_reference_file(_cospec.system_info()) if args.this_cpu else REFERENCE_FILE
    (args.out / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    kept = sum(p == "kept" for r in rows for p in r["provenance"])
    print(f"{args.out}: {len(rows)} reference generations, {kept} draft tokens kept")


if __name__ == "__main__":
    main()
