"""Branch-oracle states for the arbiter's warm-up.

For each problem, plain speculative decoding (the lossless target arbiter) runs with a
recording arbiter that sees every block and keeps nothing. Each block whose first mismatch the
walk actually reaches is a decision state: the prompt and verified tokens, the draft block, the
target's tokens and the block's features. Both branches then run to the end and are scored
(branch_oracle.py):

- reject (emit the target's token t_i): greedy speculative decoding is lossless, so this branch
  is exactly the recorded run from that state on; its answer is the run's own answer.
- keep (emit the draft token d_i): speculative decoding continues from context + d_1..d_i.

label = 1 where only the keep branch is right, 0 where only the reject branch is, -1 for ties
(both right or both wrong). Ties are stored but the warm-up leaves them out of its loss: either
decision gives the same answer there, so they teach nothing about accuracy.

    python -m cospec_local.train.collect --out runs/arbiter-data --families arith,pyfunc \\
        --train 3000 --dev 300 --threads 2

With --policy ARBITER the states are those that arbiter meets as it runs, including mismatches
after a kept token, which plain speculative decoding's first mismatches never contain. Each is
labelled by continuing both choices with that arbiter (RolloutWorker.policy_states). A warm-up on
both sets is a second round (DAgger's aggregation). The runs go to --workers processes, one
engine each.

    python -m cospec_local.train.collect --out runs/arbiter-data-policy --policy runs/arbiters/lora --workers 2

Writes OUT/states.jsonl (one decision state a line: states.LabelledState) and OUT/problems.jsonl (one line per
problem done: the resume point), and OUT/manifest.json (models and settings; a resumed run with
other ones is refused). Runs the engine only: never import torch here.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator

import numpy as np

from .. import _cospec
from ..arbiter.catalog import arbiter_dir, arbiter_identity, resolve_arbiter_path
from ..arbiter.callbacks import arbiter_from_function
from ..arbiter.file_format import ARBITER_FILE
from ..engine import Engine
from ..evaluation.task_eval import model_identity
from ..jsonl import keep_complete_lines
from ..params import GenerationParams
from ..tasks import Problem, load_task
from .branch_oracle import BranchOracle
from .states import TRAINING_SOURCES, DecisionState, LabelledState
from ..command_line import REQUIRED, comma_list, option, parse_config

if TYPE_CHECKING:
    from .rollout import RolloutPool

# Settings of the recorded runs and of their branches (the eval's defaults for these tasks).
MAX_TOKENS = 256


class Collector:
    def __init__(self, engine: Engine, params: GenerationParams, observe=None, chat: bool = False):
        """observe(block), if given, sees every block of the recorded runs (e.g. to score it with
        learned arbiters while the draft's cache holds the block's context). chat: each problem
        goes to the model as a user message in the target's chat template."""
        if engine.calibration is not None:
            # A calibration sets a keeping call's blocks from this machine's timings: the states,
            # and the arbiter trained on them, would differ from machine to machine.
            raise ValueError("the collector records states in the pair's uncalibrated blocks: "
                             "open its engine with calibration=None")
        self.engine = engine
        self.params = params
        self.observe = observe
        self.chat = chat

    def problem(self, problem: Problem, split: str) -> tuple[dict, list[LabelledState]]:
        engine, params = self.engine, self.params
        oracle = BranchOracle(engine, problem, params.max_tokens, self.chat)
        seen: dict[int, DecisionState] = {}

        def decide(block):
            if self.observe is not None:
                self.observe(block)
            seen[block["index"]] = DecisionState.from_block(block)
            return np.zeros(block["n_draft"], dtype=np.float32)

        applied: list[int] = []

        def taken(block, decisions):
            applied.extend(d[0] for d in decisions)

        def target_continues(tokens: list[int], left: int) -> str:
            return engine.generate(tokens, params, arbiter="target", max_tokens=left, stop=oracle.stops).text

        recorder = arbiter_from_function(decide, "recorder", taken=taken)
        engine.reset()
        run = engine.generate(oracle.prompt, params, arbiter=recorder, stop=oracle.stops, draft_prompt=oracle.draft_prompt)
        reject_correct = oracle.is_right(run.text)  # the reject branch of every state is this run
        states = []
        for index in applied:
            state = seen[index]
            i = state.first_mismatch()
            keep_completion = oracle.complete(state, i, keep=True, continuation=target_continues)
            states.append(LabelledState(problem.id, problem.family, split, len(oracle.prompt), state, i,
                                        keep_correct=oracle.is_right(keep_completion), reject_correct=reject_correct,
                                        keep_completion=keep_completion))
        # The prompt's tokens, as the engine saw them: the domain gate is built from them (warmup.py).
        summary = {"problem_id": problem.id, "family": problem.family, "split": split, "correct": reject_correct,
                   "tokens": len(run.tokens), "states": len(states), "prompt_tokens": oracle.prompt}
        return summary, states


def resume_point(out: Path) -> set[str]:
    """The problems a previous run finished (problems.jsonl), with both logs cut back to them: a
    problem whose states were written but whose summary was not is collected again, so its states
    must not stay behind twice. Both files are rewritten whole (atomically) before appending."""
    problems = keep_complete_lines(out / "problems.jsonl")
    done = {json.loads(line)["problem_id"] for line in problems}
    keep_complete_lines(out / "states.jsonl", lambda line: json.loads(line)["problem_id"] in done)
    return done


@dataclass
class CollectConfig:
    """Decision states of a draft/target pair on task problems (collect.py's command line)."""

    out: Path = option(REQUIRED, "Folder for states.jsonl, problems.jsonl, manifest.json.")
    model: str = option("demo-target", "Target model (named or GGUF path).", ("-m", "--model"))
    model_draft: str = option("demo-draft", "Draft model (named or GGUF path).", ("-md", "--model-draft"))
    families: str = option("arith,pyfunc", "Comma-separated task families.")
    train: int = option(3000, "Train-split problems per family.")
    dev: int = option(300, "Dev-split problems per family.")
    threads: int = option(2, "CPU threads of the engine.")
    max_tokens: int = option(MAX_TOKENS, "Most tokens per answer.")
    verify_cost: float = option(GenerationParams().verify_cost,
                                "Verify cost of the timing-free length model the blocks are drafted under "
                                "(negative: the default); the arbiters trained on these states carry it. A --policy "
                                "collection runs under its policy's own.")
    policy: str | None = option(None, "A learned arbiter (name or folder): collect the states it meets, labelled "
                                      "with its own continuations, instead of plain speculative decoding's first "
                                      "mismatches.")
    chat: bool = option(False, "Send each problem as a user message through the target's chat template (instruct "
                               "models), ended by its end of turn.")
    chat_template: str | None = option(None, "A chat template instead of the target's own (Jinja text, or a name: "
                                             "chatml, gemma).")
    chat_template_draft: str | None = option(None, "For a draft of another vocabulary: a chat template instead of "
                                                   "its own.")
    workers: int = option(2, "Engine processes of a --policy collection (threads are shared among them); plain "
                             "collection runs one engine here.")


def collection_manifest(args: CollectConfig, engine: Engine, params: GenerationParams, families: list[str],
                        policy: Path | None) -> dict:
    """What the states are of: both models, the settings, the families and, for --policy (its
    folder: policy), the arbiter and the verify cost it drafts under. A folder's manifest never
    changes: resuming checks it."""
    manifest = {"target": model_identity(engine.target_path), "draft": model_identity(engine.draft_path),
                "draft_fingerprint": _cospec.model_fingerprint(engine.draft_path),
                "target_fingerprint": _cospec.model_fingerprint(engine.target_path),
                "params": {k: v for k, v in vars(params).items() if k not in ("arbiter", "stop")},
                "families": families, "n_vocab": engine.n_vocab}
    if args.chat:  # only where set: folders collected before it existed stay resumable
        manifest["chat"] = True
    if args.chat_template is not None:
        manifest["chat_template"] = args.chat_template
    if args.chat_template_draft is not None:
        manifest["chat_template_draft"] = args.chat_template_draft
    if policy is not None:
        if not (policy / ARBITER_FILE).is_file():
            sys.exit(f"{args.policy}: no learned arbiter there ({ARBITER_FILE} missing)")
        manifest["policy"] = arbiter_identity(args.policy)
        carried = engine.arbiter(str(policy)).meta("verify_cost")
        manifest["verify_cost"] = float(carried) if carried is not None else _cospec.DEFAULT_VERIFY_COST
    else:
        manifest["verify_cost"] = args.verify_cost if args.verify_cost >= 0 else _cospec.DEFAULT_VERIFY_COST
    return manifest


def write_manifest(out: Path, manifest: dict) -> None:
    path = out / "manifest.json"
    if path.is_file() and json.loads(path.read_text()) != manifest:
        sys.exit(f"{out} holds states of other models or settings; use another --out")
    path.write_text(json.dumps(manifest, indent=1))


def policy_results(args: CollectConfig, engine: Engine, policy: Path, todo: list) -> tuple[Iterator, RolloutPool]:
    """(summary, states) of each problem, from the policy (its folder) deciding in worker processes."""
    from .rollout import PolicyStatesTask, RolloutPool, WorkerConfig

    worker = WorkerConfig(str(engine.target_path), str(engine.draft_path), max(1, args.threads // args.workers),
                          args.max_tokens, chat=args.chat, chat_template=args.chat_template,
                          draft_chat_template=args.chat_template_draft)
    engine.close()  # the workers hold their own engines; this one only named the models
    pool = RolloutPool(worker, args.workers)
    results = ((r.summary(), r.states) for r in pool.map(PolicyStatesTask(p, str(policy), split) for p, split in todo))
    return results, pool


def write_states(out: Path, results: Iterable, total: int) -> tuple[int, int]:
    """Append each problem's states, then its summary (the resume point); returns the states and
    the decisive ones written."""
    from tqdm import tqdm

    with (out / "states.jsonl").open("a", encoding="utf-8") as states_log, \
            (out / "problems.jsonl").open("a", encoding="utf-8") as problems_log:
        bar = tqdm(results, total=total, desc="collecting", unit="problem", file=sys.stderr)
        n_states = n_decisive = 0
        for summary, states in bar:
            for s in states:
                states_log.write(json.dumps(s.to_json()) + "\n")
                n_decisive += s.label >= 0
            n_states += len(states)
            states_log.flush()
            problems_log.write(json.dumps(summary) + "\n")  # after its states: the resume point
            problems_log.flush()
            bar.set_postfix(states=n_states, decisive=n_decisive)
    return n_states, n_decisive


def main(argv: list[str] | None = None) -> None:
    args = parse_config(CollectConfig, argv, __doc__.split("\n\n")[0])
    if args.workers < 1:
        sys.exit("--workers must be at least 1")
    if args.policy is not None and args.verify_cost >= 0:
        sys.exit("--verify-cost: a --policy collection drafts under its policy's own verify cost")
    families = comma_list(args.families)
    args.out.mkdir(parents=True, exist_ok=True)
    params = GenerationParams(max_tokens=args.max_tokens, verify_cost=args.verify_cost, spec_type=TRAINING_SOURCES)
    with Engine(args.model, args.model_draft, n_ctx=1024, n_threads=args.threads, chat_template=args.chat_template,
                draft_chat_template=args.chat_template_draft, calibration=None) as engine:
        policy = arbiter_dir(resolve_arbiter_path(args.policy)) if args.policy is not None else None
        write_manifest(args.out, collection_manifest(args, engine, params, families, policy))
        done = resume_point(args.out)
        todo = [(p, split) for split, n in (("dev", args.dev), ("train", args.train)) if n > 0
                for f in families for p in load_task(f, split, n) if p.id not in done]
        pool = None
        if policy is not None:
            results, pool = policy_results(args, engine, policy, todo)
        else:
            collector = Collector(engine, params, chat=args.chat)
            results = (collector.problem(p, split) for p, split in todo)
        t0 = time.time()
        try:
            n_states, n_decisive = write_states(args.out, results, len(todo))
        finally:  # the workers end with the collection, Ctrl-C included (problems.jsonl is the resume point)
            if pool is not None:
                pool.close()
    print(f"collected {len(todo)} problems, {n_states} states ({n_decisive} decisive) in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
