"""Rollouts of full CoSpec generations for GRPO, in worker processes of their own.

Each worker process holds one engine (one draft/target pair) and never imports torch: after
torch has run a multi-threaded op in a process, llama.cpp decodes there several times slower.
The trainer starts the workers with the `spawn` method, sends them tasks (the *Task classes at
the end: a problem, the folder of the policy, settings) and gets back plain records.

- `rollouts`: G generations of one problem, greedy tokens, each arbiter decision drawn from
  Bernoulli(P(keep)) with a recorded seed (same seed, same arbiter: same rollout). Every block
  where the walk applied a decision is recorded with what the policy update needs (DecidedBlock):
  the decision state, the decided positions, P(keep) as the engine used it, the decision, and the
  target's probability of the draft token there.
- `branches`: credit for single decisions (GRPO's credit=state): both choices at some decisions of
  a rollout, each continued by the policy (BranchedState).
- `policy_states`: the branch-oracle states a policy meets (collect.py --policy).
- `greedy`: one generation deciding by the arbiter's threshold (dev accuracy).
- `screen`: one plain speculative generation counting the mismatches its walk reaches. A problem
  without any cannot give the arbiter a decision, so the trainer draws its prompts from the rest.
"""
from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np

from ..arbiter.callbacks import arbiter_from_function
from ..arbiter.catalog import BUILTIN_NAMES
from ..child_processes import die_with_parent
from ..engine import Engine
from ..params import GenerationParams
from ..tasks import FAMILY_STOPS, Problem, score
from .branch_oracle import BranchOracle, Continuation
from .states import TRAINING_SOURCES, DecisionState, LabelledState


@dataclass(frozen=True)
class WorkerConfig:
    target: str
    draft: str
    threads: int
    max_tokens: int
    n_ctx: int = 1024
    chat: bool = False  # problems go through the target's chat template (policy_states; BranchOracle)
    chat_template: str | None = None        # instead of the target's own
    draft_chat_template: str | None = None  # a draft of another vocabulary: instead of its own


def _softmax_at(logits: np.ndarray, token: int) -> float:
    z = logits.astype(np.float64)
    z = np.exp(z - z.max())
    return float(z[token] / z.sum())


@dataclass(frozen=True)
class DecidedBlock:
    """A block of a sampled rollout where the walk applied decisions, as the policy update needs it."""

    state: DecisionState
    positions: list[int]   # the decided positions (mismatches the walk reached)
    keep: list[bool]       # the decision drawn at each
    p_keep: list[float]    # the P(keep) it was drawn from, as the engine used it
    p_target: list[float]  # the target's probability of the draft token there (the reward's risky keeps)


@dataclass(frozen=True)
class BranchedState:
    """A decision of a policy rollout with both choices continued by the policy (credit=state)."""

    state: DecisionState
    position: int
    p_keep: float    # the P(keep) the rollout's decision was drawn from
    kept: bool       # the rollout's decision
    q_keep: float    # the share of the keep choice's continuations that end right
    q_reject: float  # ... of the reject choice's


@dataclass
class Rollout:
    """One generation of the policy with its decisions drawn (credit=rollout)."""
    problem_id: str
    family: str
    seed: int
    correct: bool
    text: str
    provenance: list
    blocks: list[DecidedBlock]  # every block where the policy decided, with what it decided


@dataclass
class Branched:
    """One rollout of the policy, and both choices tried at some of its decisions (credit=state)."""
    problem_id: str
    family: str
    seed: int
    correct: bool
    decisions: int  # the rollout's decisions
    kept: int       # of those, the ones that kept the draft's token
    states: list[BranchedState]


@dataclass
class PolicyStates:
    """The states the policy met on one problem, labelled by both choices' outcomes (collect --policy)."""
    problem_id: str
    family: str
    split: str
    correct: bool
    tokens: int
    states: list  # LabelledState

    def summary(self) -> dict:
        """Its line of problems.jsonl, the resume point of a collection."""
        return {"problem_id": self.problem_id, "family": self.family, "split": self.split, "correct": self.correct,
                "tokens": self.tokens, "states": len(self.states)}


@dataclass
class GreedyOutcome:
    """One problem decided by the arbiter's threshold (a dev evaluation)."""
    problem_id: str
    family: str
    correct: bool
    tokens: int
    kept: int
    decisions: int


@dataclass
class Screening:
    """One problem under plain speculative decoding: the mismatches it reaches, and whether the
    target's answer is right."""
    problem_id: str
    family: str
    mismatches: int
    target_correct: bool


class RolloutWorker:
    def __init__(self, cfg: WorkerConfig):
        self.cfg = cfg
        # Uncalibrated: a policy that decides through Python carries no cost model of its own, and its
        # blocks must be those the learned arbiter drafts natively (its recorded model, the defaults').
        self.engine = Engine(cfg.target, cfg.draft, n_ctx=cfg.n_ctx, n_threads=cfg.threads, chat_template=cfg.chat_template,
                             draft_chat_template=cfg.draft_chat_template, calibration=None)
        # States are drafted by the draft model alone (TRAINING_SOURCES), as the arbiter's training assumes.
        self.params = GenerationParams(max_tokens=cfg.max_tokens, spec_type=TRAINING_SOURCES)
        self.arbiter_path: str | None = None

    def close(self) -> None:
        self.engine.close()

    def _policy(self, path: str, threshold: float | None = None):
        """The learned arbiter in `path`, reloaded when the trainer points at a new folder."""
        if path != self.arbiter_path:
            if self.arbiter_path is not None:
                self.engine.unload_arbiter(self.arbiter_path)
            self.arbiter_path = path
        return self.engine.arbiter(path, threshold=threshold)

    def _generate(self, problem: Problem, **overrides):
        self.engine.reset()  # every generation from a clean cache: a function of its inputs alone
        return self.engine.generate(problem.prompt, self.params, stop=tuple(FAMILY_STOPS.get(problem.family, ())),
                                    **overrides)

    def _sampled(self, prompt, policy, seed: int, temperature: float, **overrides):
        """One generation with decisions drawn from the policy (at `temperature`, see `rollouts`).
        Returns the run, its decided blocks, and one (block index in that list, position,
        generated-token index, P(keep), keep) per decision."""
        blocks: list[DecidedBlock] = []
        decisions_made: list[tuple] = []

        def decide(block):
            p = policy.score(block)
            if temperature == 1.0:
                return p
            logit = np.log(np.clip(p, 1e-6, 1 - 1e-6)) - np.log1p(-np.clip(p, 1e-6, 1 - 1e-6))
            return (1.0 / (1.0 + np.exp(-logit / temperature))).astype(np.float32)

        def taken(block, decisions):
            positions = [int(d[1]) for d in decisions]
            draft, logits = block["draft"], block["target_logits"]
            blocks.append(DecidedBlock(DecisionState.from_block(block), positions,
                                       keep=[bool(d[4]) for d in decisions], p_keep=[float(d[3]) for d in decisions],
                                       p_target=[_softmax_at(logits[j], int(draft[j])) for j in positions]))
            decisions_made.extend((len(blocks) - 1, int(d[1]), int(d[2]), float(d[3]), bool(d[4])) for d in decisions)

        recorder = arbiter_from_function(decide, "rollout", taken=taken)
        self.engine.reset()  # every generation from a clean cache: a function of its inputs alone
        run = self.engine.generate(prompt, self.params, arbiter=recorder, sample_arbiter=True, seed=seed,
                                   **overrides)
        return run, blocks, decisions_made

    def _continued_by_threshold(self, policy, stop) -> Continuation:
        """Branches continued by the policy deciding by its threshold, each from a clean cache."""
        def continuation(tokens: list[int], left: int) -> str:
            self.engine.reset()
            return self.engine.generate(tokens, self.params, arbiter=policy, stop=stop, max_tokens=left).text

        return continuation

    def _continued_by_sampling(self, policy, stop, seed: int, temperature: float) -> Continuation:
        """Branches continued by the policy with its decisions drawn from `seed` (see `rollouts`)."""
        def continuation(tokens: list[int], left: int) -> str:
            return self._sampled(tokens, policy, seed, temperature, stop=stop, max_tokens=left)[0].text

        return continuation

    def rollouts(self, problem: Problem, arbiter_path: str, seeds: list[int], temperature: float = 1.0) -> list[Rollout]:
        """`temperature` > 1 draws decisions from sigmoid(logit(P(keep)) / temperature): the policy's
        near-certain decisions are tried the other way more often. The recorded P(keep) is the one the
        decision was drawn from, so the trainer's importance weight corrects for it."""
        policy = self._policy(arbiter_path)
        stop = tuple(FAMILY_STOPS.get(problem.family, ()))
        out = []
        for seed in seeds:
            run, blocks, _ = self._sampled(problem.prompt, policy, seed, temperature, stop=stop)
            out.append(Rollout(problem.id, problem.family, seed, bool(score(problem, run.text)), run.text,
                               run.provenance, blocks))
        return out

    def branches(self, problem: Problem, arbiter_path: str, seed: int, n_states: int, continuations: int,
                 temperature: float = 1.0, greedy_continuations: bool = False) -> Branched:
        """Credit for single decisions: one rollout of the policy, then at up to `n_states` of its
        decisions (drawn by `seed`) both choices are taken and each is continued `continuations`
        times by the policy. A state's q_keep / q_reject is the share of its continuations that end
        correct: their difference is what that one decision was worth, with the rest of the
        rollout held to the policy. With `greedy_continuations` the continuations decide by the
        policy's threshold, as it is used (and evaluated): one continuation per choice then says it all."""
        policy = self._policy(arbiter_path)
        oracle = BranchOracle(self.engine, problem, self.params.max_tokens)
        run, blocks, decisions = self._sampled(problem.prompt, policy, seed, temperature, stop=oracle.stops)
        rng = np.random.default_rng(seed)
        chosen = sorted(rng.choice(len(decisions), size=min(n_states, len(decisions)), replace=False).tolist())
        by_threshold = [self._continued_by_threshold(policy, oracle.stops)]
        states = []
        for c, i in enumerate(chosen):
            b, j, _, p_keep, kept = decisions[i]
            state = blocks[b].state
            # The same seeds for both choices: the difference of their outcomes is paired.
            sampled = [self._continued_by_sampling(policy, oracle.stops, (seed * 1_000_003 + c * 1009 + r) % (1 << 63),
                                                   temperature) for r in range(continuations)]
            q = {}
            for keep in (True, False):
                ended = oracle.branch(state, j, keep).ended  # nothing to continue: one outcome
                runs = by_threshold if greedy_continuations or ended else sampled
                outcomes = [oracle.is_right(oracle.complete(state, j, keep, continuation)) for continuation in runs]
                q[keep] = sum(outcomes) / len(outcomes)
            states.append(BranchedState(state, j, p_keep, kept, q_keep=q[True], q_reject=q[False]))
        return Branched(problem.id, problem.family, seed, oracle.is_right(run.text), decisions=len(decisions),
                        kept=sum(d[4] for d in decisions), states=states)

    def policy_states(self, problem: Problem, arbiter_path: str, split: str) -> PolicyStates:
        """Branch-oracle states where the policy itself meets them (for collect.py --policy): one
        generation deciding by the policy's threshold; at every decision it applied, both choices are
        taken and each is continued by the policy (by threshold, as it is used). Labels as collect.py's.
        Unlike collect.py's states (first mismatches of plain speculative decoding, the keep branch
        continued by the target), these include the mismatches after a kept token and credit a choice
        with the policy's own later decisions: the states and the continuation the arbiter meets when
        it runs."""
        policy = self._policy(arbiter_path)
        threshold = policy.threshold
        oracle = BranchOracle(self.engine, problem, self.params.max_tokens, self.cfg.chat)
        seen: dict[int, tuple[DecisionState, np.ndarray]] = {}
        decisions: list[tuple] = []

        def decide(block):
            p = np.asarray(policy.score(block), dtype=np.float32)
            seen[block["index"]] = (DecisionState.from_block(block), p)
            return (p >= threshold).astype(np.float32)

        def taken(block, applied):
            decisions.extend((block["index"], int(d[1]), int(d[2]), bool(d[4])) for d in applied)

        self.engine.reset()
        run = self.engine.generate(oracle.prompt, self.params, arbiter=arbiter_from_function(decide, "policy", taken=taken),
                                   stop=oracle.stops, draft_prompt=oracle.draft_prompt)
        policy_continues = self._continued_by_threshold(policy, oracle.stops)
        states = []
        for index, j, t, kept in decisions:
            state, p_keep = seen[index]
            keep_correct, reject_correct = (oracle.is_right(oracle.complete(state, j, keep, policy_continues))
                                            for keep in (True, False))
            states.append(LabelledState(problem.id, problem.family, split, len(oracle.prompt), state, j,
                                        keep_correct=keep_correct, reject_correct=reject_correct,
                                        p_keep=float(p_keep[j]), kept=kept, token_index=t))
        return PolicyStates(problem.id, problem.family, split, oracle.is_right(run.text), len(run.tokens), states)

    def greedy(self, problem: Problem, arbiter: str, threshold: float | None = None) -> GreedyOutcome:
        """Decisions by threshold (the arbiter's own, or `threshold`)."""
        spec = self._policy(arbiter, threshold) if arbiter not in BUILTIN_NAMES else arbiter
        run = self._generate(problem, arbiter=spec)
        return GreedyOutcome(problem.id, problem.family, bool(score(problem, run.text)), len(run.tokens),
                             kept=run.stats.arbiter_keeps, decisions=len(run.decisions))

    def screen(self, problem: Problem) -> Screening:
        mismatches = 0

        def decide(block):
            return np.zeros(block["n_draft"], dtype=np.float32)

        def taken(block, decisions):
            nonlocal mismatches
            mismatches += len(decisions)

        run = self._generate(problem, arbiter=arbiter_from_function(decide, "screen", taken=taken))
        return Screening(problem.id, problem.family, mismatches, bool(score(problem, run.text)))


# ---------------------------------------------------------------- tasks for the worker processes
# One class per kind of work, sent to a worker process (pickled) and run there on its engine.

@dataclass(frozen=True)
class ScreenTask:
    problem: Problem

    def run(self, worker: RolloutWorker) -> Screening:
        return worker.screen(self.problem)


@dataclass(frozen=True)
class GreedyTask:
    problem: Problem
    arbiter: str
    threshold: float | None = None

    def run(self, worker: RolloutWorker) -> GreedyOutcome:
        return worker.greedy(self.problem, self.arbiter, self.threshold)


@dataclass(frozen=True)
class RolloutsTask:
    problem: Problem
    arbiter: str
    seeds: list[int]
    temperature: float = 1.0

    def run(self, worker: RolloutWorker) -> list[Rollout]:
        return worker.rollouts(self.problem, self.arbiter, self.seeds, self.temperature)


@dataclass(frozen=True)
class BranchesTask:
    problem: Problem
    arbiter: str
    seed: int
    n_states: int
    continuations: int
    temperature: float = 1.0
    greedy_continuations: bool = False

    def run(self, worker: RolloutWorker) -> Branched:
        return worker.branches(self.problem, self.arbiter, self.seed, self.n_states, self.continuations,
                               self.temperature, self.greedy_continuations)


@dataclass(frozen=True)
class PolicyStatesTask:
    problem: Problem
    arbiter: str
    split: str

    def run(self, worker: RolloutWorker) -> PolicyStates:
        return worker.policy_states(self.problem, self.arbiter, self.split)


Task = ScreenTask | GreedyTask | RolloutsTask | BranchesTask | PolicyStatesTask


# ---------------------------------------------------------------- worker processes

_WORKER: RolloutWorker | None = None


def _init(cfg: WorkerConfig, parent_pid: int) -> None:
    global _WORKER
    die_with_parent(parent_pid)  # a collection or GRPO run killed outright takes its workers with it
    _WORKER = RolloutWorker(cfg)


def _run(task: Task) -> object:
    return task.run(_WORKER)


class RolloutPool:
    """`workers` processes, one engine each, running tasks (the *Task classes above). A worker
    that dies (a signal, memory) fails the call with BrokenProcessPool instead of hanging it."""

    def __init__(self, cfg: WorkerConfig, workers: int):
        if workers < 1:
            raise ValueError("rollouts need at least one worker process")
        self._pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_init,
                                         initargs=(cfg, os.getpid()))

    def map(self, tasks: Iterable[Task]) -> Iterator:
        """Results in task order, as they complete."""
        return self._pool.map(_run, list(tasks))

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> "RolloutPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
