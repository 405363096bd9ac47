"""An arbiter for the pair a user already has: `cospec-local arbiter train` runs this recipe.

    cospec-local arbiter train my-arbiter -m TARGET.gguf -md DRAFT.gguf --task mine.jsonl --minutes 60

Stages, each writing into the run's work folder (WORK/stages/NAME.json marks one done, with the
settings it ran under; a rerun of the same command skips finished stages and resumes the one that
was interrupted, which collection and evaluation do problem by problem):

1. headroom   target-only and draft-only on dev problems: their accuracies and union. Where the
              draft solves (almost) none of the problems the target misses, no arbiter can beat
              the target: the run says so and stops (--ignore-headroom goes on).
2. collect    branch-oracle decision states on train and dev problems (collect.py, its own process).
3. warmup     the LoRA and/or features arbiters on those states, their keep threshold on dev
              (warmup.py, its own process: torch).
   (--rounds N) rounds 2..N: collect-R gathers the states the last round's chosen arbiter meets
              as it runs, each choice continued by that arbiter (collect.py --policy), and
              warmup-R trains afresh on every round's states. Round one's states are plain
              speculative decoding's first mismatches, so it never learns what follows its own
              keeps: a correction that needs several kept tokens in a row (a two-digit number)
              is credited one token at a time and rarely finished.
   gate       a classifier domain gate for each trained arbiter (fit_gate.py, its own process): the
              tasks' words against general chat and the other task families, in several formats,
              so the arbiter decides its tasks asked in other words and stays quiet elsewhere.
4. grpo       (--grpo) GRPO from the warm-up LoRA arbiter (grpo.py); reported beside the warm-up,
              never replacing it.
5. evaluate   target-only, draft-only, sps and every trained arbiter on held-out test problems.
6. install    the arbiter the dev split prefers, into the user's arbiter folder under NAME, with
              its evaluation; `--arbiter NAME` then finds it in every command.

The engine stages run here (this module never imports torch); torch runs only in the warm-up's
and GRPO's processes, since llama.cpp decodes far slower in a process where torch has run.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Callable

from ..arbiter.file_format import FEATURES, LORA
from ..arbiter.evaluations import BASELINE_RUNS, evaluation_entry, verdict
from ..child_processes import die_with_parent
from ..evaluation.machine import busy_note
from ..models import prompt_style
from .collect import CollectConfig
from ..command_line import config_args
from .fit_gate import GateConfig, default_gate_kind
from .grpo import GRPOConfig
from .warmup import WarmupConfig
from .states import TRAINING_SOURCES, LabelledState

# Headroom: below these, the draft solves too few of the target's misses for an arbiter to matter.
MIN_HEADROOM_SHARE = 0.02
MIN_HEADROOM_PROBLEMS = 2
# Fewer decisive states than this (exactly one branch right) cannot train a keep decision.
MIN_DECISIVE_STATES = 20
DEFAULT_KINDS = (LORA, FEATURES)  # LoRA first: a tie on dev goes to it (it reads the text)
# Collection's time per problem over target-only's (a recorded run with Python's recording
# arbiter, features, and each state's keep branch continued): the demo pair on arith, 2 cores,
# 60 problems in 4 s at 0.07 s each alone; 15x that with a test suite beside it.
COLLECT_TARGET_RATIO = 2.0
# The warm-up's time scale: 6.5 ms per decisive state and epoch for the demo draft (468 kB, Q8_0) on 2 cores.
DEMO_DRAFT_BYTES = 468_224
GATE_PROMPTS_PER_TASK = 600  # train prompts per task the classifier gate learns the tasks' words from
PILOT_PROBLEMS = 6  # dev problems collected once in the headroom stage, to time collection on this pair


def _opt(default, help: str, **extra):
    return field(default=default, metadata={"help": help, **extra})


@dataclass
class RecipeSettings:
    """What `cospec-local arbiter train` does; each field's help is its command-line help."""

    name: str = _opt(None, "Name to install the arbiter under (`--arbiter NAME`).")
    target: str = _opt("demo-target", "Target model (named or GGUF path).")
    draft: str = _opt("demo-draft", "Draft model (named or GGUF path): the arbiter is made for this file.")
    tasks: tuple[str, ...] = _opt(("general",), "Tasks: general (the built-in mix: short-answer facts, words and "
                                                "numbers in several wordings and formats, arithmetic and code), "
                                                "built-in families (arith, pyfunc, continents, past-tense, ...), "
                                                "benchmark jsonl files or your own jsonl ({prompt, answer} or "
                                                "{prompt, tests}); general,FILE adds yours to the mix.")
    chat: bool = _opt(False, "Send each problem through the target's chat template (instruct models).")
    chat_template: str | None = _opt(None, "A chat template instead of the target's own (Jinja text, or a name: "
                                           "chatml, gemma); with --chat.")
    draft_chat_template: str | None = _opt(None, "For a draft of another vocabulary, which reads each problem in its "
                                                 "own format: a template instead of its own; with --chat.")
    kinds: tuple[str, ...] = _opt(DEFAULT_KINDS, "Which arbiters to train: lora (the draft with an adapter; reads the "
                                         "text), features (a small MLP over the block's numbers; no extra pass).")
    train: int = _opt(1000, "Train problems per task (fewer where a file has fewer; --minutes may lower it).")
    dev: int = _opt(100, "Dev problems per task: the headroom check and the keep threshold.")
    test: int = _opt(200, "Held-out test problems per task for the final evaluation.")
    minutes: float | None = _opt(None, "Time budget: the train problems are cut to what fits (an estimate, "
                                       "from the headroom stage's timings).")
    max_tokens: int = _opt(256, "Most tokens per answer.")
    threads: int = _opt(2, "CPU threads.")
    device: str = _opt("auto", "Device of the warm-up: auto (CUDA where torch sees one), cpu or cuda (GRPO's "
                               "update runs on the CPU).")
    grpo: bool = _opt(False, "After the warm-up, GRPO from the LoRA arbiter; reported beside it, never "
                             "installed in its place.")
    grpo_steps: int = _opt(40, "GRPO steps (with --grpo).")
    rounds: int = _opt(1, "Rounds of decision states: from round 2 on, the states the last round's arbiter meets "
                          "as it runs (its own keeps continued), each round's warm-up on all of them. Worth it where "
                          "round one recovers few of the draft's wins: corrections that need several kept tokens in "
                          "a row (one more collection each).")
    ignore_headroom: bool = _opt(False, "Go on where the headroom check finds too little for an arbiter to win.")
    seed: int = _opt(0, "Seed of the warm-up (and GRPO).")

    def __post_init__(self):
        from ..tasks import expand_tasks

        self.tasks = expand_tasks(self.tasks)  # "general": the families of the built-in mix

    def recorded(self) -> dict:
        """The settings a finished stage ran under: a rerun with others does not reuse it."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


def setting_help(name: str) -> str:
    return next(f.metadata["help"] for f in fields(RecipeSettings) if f.name == name)


def setting_default(name: str):
    """A setting's default as written (the command line shows "general", not the mix's families)."""
    return next(f.default for f in fields(RecipeSettings) if f.name == name)


DEFAULTS = RecipeSettings()


class RecipeStop(Exception):
    """The recipe cannot go on (no headroom, nothing to learn): the message says why, for the user."""


def default_work_dir(name: str) -> Path:
    from ..models import cache_dir

    return cache_dir() / "arbiter-runs" / name


# ---------------------------------------------------------------- stages and their records

class Stages:
    """WORK/stages/NAME.json: a finished stage's result and the inputs it ran on (the settings it
    depends on and the results of the stages before it). A stage writes into its own folder,
    WORK/NAME-<digest of its inputs>: a rerun with the same inputs resumes there, and other
    inputs (a changed setting, a retrained arbiter) start a fresh folder instead of meeting stale
    files."""

    def __init__(self, work: Path):
        self.work = work
        self.dir = work / "stages"

    def folder(self, name: str, inputs: dict) -> Path:
        digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:12]
        return self.work / f"{name}-{digest}"

    def done(self, name: str, inputs: dict) -> dict | None:
        path = self.dir / f"{name}.json"
        if not path.is_file():
            return None
        saved = json.loads(path.read_text())
        return saved["result"] if saved.get("inputs") == json.loads(json.dumps(inputs)) else None

    def finish(self, name: str, inputs: dict, result: dict) -> dict:
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"{name}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"inputs": inputs, "result": result}, indent=1))
        os.replace(tmp, path)
        return result


def _say(text: str = "") -> None:
    print(text, file=sys.stderr, flush=True)


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


# ---------------------------------------------------------------- problems

def problems_of(settings: RecipeSettings, split: str, per_task: int, tasks: tuple[str, ...] | None = None) -> list:
    """Each task's first `per_task` problems of `split` (of `tasks`, default all the settings');
    an empty task, and problems of two tasks that share an id, are refused."""
    from ..tasks import load_task

    out = []
    for task in tasks or settings.tasks:
        problems = load_task(task, split, per_task)
        if not problems:
            raise RecipeStop(f"{task}: no {split} problems (a file's rows are split 70/10/20 by a hash of the "
                             f"prompt; an empty or tiny file has none)")
        out += problems
    counts: dict[str, int] = {}
    for p in out:
        counts[p.id] = counts.get(p.id, 0) + 1
    if twice := sorted(i for i, n in counts.items() if n > 1):
        raise RecipeStop(f"problem ids given twice ({', '.join(twice[:3])}): give each row an \"id\" field, unique "
                         f"over all the task files")
    return out


def score_problem(problem, completion: str) -> bool:
    from ..tasks import score

    return score(problem, completion)


# ---------------------------------------------------------------- headroom

def headroom(summary: dict) -> dict:
    """Target, draft and union accuracy of an eval summary over target-only and draft-only."""
    runs = summary["runs"]
    n = summary["problems"]
    target, draft = runs["target-only"], runs["draft-only"]
    return {"problems": n, "target": target["accuracy"], "draft": draft["accuracy"],
            "union": summary["oracle_union"], "draft_only_solves": summary["non_nested"],
            "target_ms_per_problem": target["tokens"] / max(target["predicted_per_second"], 1e-9) * 1000 / max(n, 1),
            "draft_ms_per_problem": draft["tokens"] / max(draft["predicted_per_second"], 1e-9) * 1000 / max(n, 1)}


def headroom_verdict(room: dict) -> str | None:
    """Why an arbiter cannot win here, or None when the draft solves enough of the target's misses."""
    wins, n = room["draft_only_solves"], room["problems"]
    if wins >= MIN_HEADROOM_PROBLEMS and wins >= MIN_HEADROOM_SHARE * n:
        return None
    return (f"the draft alone solves {wins} of the {n} dev problems, ones the target misses "
            f"({100 * wins / max(n, 1):.1f}%): "
            f"an arbiter that keeps the draft's tokens can add at most that much, and needs at least "
            f"{MIN_HEADROOM_PROBLEMS} problems and {100 * MIN_HEADROOM_SHARE:.0f}% to learn from. A draft that is "
            f"better than the target at something (a domain-tuned model) is what CoSpec needs; "
            f"--ignore-headroom goes on anyway")


def headroom_report(room: dict) -> str:
    return (f"headroom on {room['problems']} dev problems: target {100 * room['target']:.1f}%, "
            f"draft {100 * room['draft']:.1f}%, either {100 * room['union']:.1f}% "
            f"(the draft alone solves {room['draft_only_solves']}); "
            f"{room['target_ms_per_problem'] / 1000:.2f} s a problem for the target, "
            f"{room['draft_ms_per_problem'] / 1000:.2f} s for the draft")


SPLIT_NAMES = ("train", "dev", "test")


def available_problems(settings: RecipeSettings) -> dict[str, list[int | None]]:
    """Each task's problems in each split: a file's count, a generated family's capacity (None: any number)."""
    from ..tasks import TASKS, load_task

    return {split: [TASKS[str(task)].capacity(split) if str(task) in TASKS else len(load_task(task, split))
                    for task in settings.tasks] for split in SPLIT_NAMES}


@dataclass(frozen=True)
class SplitSizes:
    """The problems a run uses in each split, all tasks together: what --train, --dev and --test ask,
    or fewer where a file has fewer; `*_exhausted`: every task gives all it has (asking for more
    adds nothing)."""
    train: int
    dev: int
    test: int
    train_exhausted: bool
    dev_exhausted: bool

    @classmethod
    def plan(cls, available: dict[str, list[int | None]], settings: RecipeSettings, n_train: int) -> "SplitSizes":
        asked = {"train": n_train, "dev": settings.dev, "test": settings.test}
        used = {split: sum(asked[split] if a is None else min(asked[split], a) for a in available[split])
                for split in SPLIT_NAMES}
        exhausted = {split: all(a is not None and a <= asked[split] for a in available[split])
                     for split in ("train", "dev")}
        return cls(**used, train_exhausted=exhausted["train"], dev_exhausted=exhausted["dev"])

    def text(self, n_tasks: int) -> str:
        def part(n: int, split: str, exhausted: bool = False) -> str:
            return f"{n} {split}" + (" (all the task files have)" if exhausted else "")

        return (f"{part(self.train, 'train', self.train_exhausted)}, {part(self.dev, 'dev', self.dev_exhausted)} and "
                f"{part(self.test, 'test')} problems" + (f" over {n_tasks} tasks" if n_tasks > 1 else ""))


# ---------------------------------------------------------------- estimates

def estimate_seconds(room: dict, settings: RecipeSettings, sizes: SplitSizes) -> dict:
    """Rough stage times from the headroom stage's timings: collection (a recorded speculative run,
    then the keep branch of each decision state to the end) and its decisive states from the
    headroom stage's pilot collection; the warm-up is timed per decisive state and epoch on the
    demo pair and scaled by the draft's size."""
    t_target = room["target_ms_per_problem"] / 1000
    t_draft = room["draft_ms_per_problem"] / 1000
    t_spec = max(t_draft, 0.8 * t_target)  # speculative decoding runs near the target's speed on a CPU
    pilot = room.get("collect_pilot")
    if pilot and pilot["problems"]:  # measured on this pair
        collect = (sizes.train + sizes.dev) * pilot["seconds_per_problem"]
        decisive = pilot["decisive_per_problem"] * sizes.train
    else:  # the demo pair's ratios (a headroom recorded before the pilot existed)
        collect = (sizes.train + sizes.dev) * t_target * COLLECT_TARGET_RATIO
        decisive = 0.4 * 0.4 * sizes.train
    evaluate = sizes.test * (t_target + t_draft + t_spec * (1 + len(settings.kinds)))
    warmup = 0.0
    if LORA in settings.kinds:
        warmup += decisive * 12 * 0.0065 * max(1.0, room["draft_bytes"] / DEMO_DRAFT_BYTES) ** 0.8
    if FEATURES in settings.kinds:
        warmup += 30.0
    grpo = settings.grpo_steps * 14.0 * max(1.0, t_spec / 0.1) if settings.grpo else 0.0
    # A later round collects about as many states again, and warms up on all rounds' (SmolLM2's arithmetic
    # pair: round two's collection took as long as round one's).
    rounds = settings.rounds
    return {"collect": collect * rounds, "warmup": warmup * rounds * (rounds + 1) / 2, "grpo": grpo,
            "evaluate": evaluate}


def more_problems_advice(sizes: SplitSizes, n_tasks: int, per_problem: float | None = None) -> str:
    """How to get more decision states: more problems where the flags can give them, more rows
    where the task files already give all they have, or another task."""
    other = "a task where the two models part ways more often"
    if not sizes.train_exhausted:
        if per_problem:
            return f"--train {int(4 * MIN_DECISIVE_STATES / (per_problem * n_tasks)) + 1} or more, or {other}"
        return f"more train or dev problems (--train, --dev, --minutes), or {other}"
    return (f"more rows in the task files (they give {sizes.train} train and {sizes.dev} dev problems in all: a "
            f"file's rows are split 70/10/20 by a hash of the prompt), or {other}")


def too_few_states_warning(room: dict, sizes: SplitSizes, n_tasks: int) -> str | None:
    """A word before collecting where the pilot's yield says the train problems will give fewer
    decisive states than the warm-up needs (the run would stop after collecting)."""
    pilot = room.get("collect_pilot")
    if not pilot or not pilot["problems"]:
        return None
    expected = pilot["decisive_per_problem"] * sizes.train
    if expected >= 2 * MIN_DECISIVE_STATES:  # six pilot problems give a rough yield: keep a margin
        return None
    per_problem = pilot["decisive_per_problem"]
    return (f"note: the pilot found {per_problem:.2f} decisive states a problem ({pilot['problems']} dev problems), "
            f"so {sizes.train} train problems may give about {expected:.0f}, near or under the {MIN_DECISIVE_STATES} "
            f"the warm-up needs: {more_problems_advice(sizes, n_tasks, per_problem)} (the collection goes on, and "
            f"stops before the warm-up if they are too few)")


def train_problems_for_budget(room: dict, settings: RecipeSettings, available: dict, spent: float) -> int:
    """The most train problems per task (up to --train) whose estimated stages fit --minutes."""
    if settings.minutes is None:
        return settings.train
    left = settings.minutes * 60 - spent
    best = 0
    lo, hi = 0, settings.train
    while lo <= hi:  # estimates grow with n_train
        mid = (lo + hi) // 2
        if sum(estimate_seconds(room, settings, SplitSizes.plan(available, settings, mid)).values()) <= left:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


# ---------------------------------------------------------------- the run

@dataclass
class RecipeRun:
    settings: RecipeSettings
    work: Path
    install_dir: Path
    say: Callable[[str], None] = _say
    python: str = sys.executable

    def __post_init__(self):
        self.stages = Stages(self.work)
        self.t0 = time.time()

    # Each stage's result is a small dict; a finished stage is not run again.

    def inputs(self, *names: str, **results) -> dict:
        """A stage's inputs: these settings and the results of the stages it follows. The chat
        templates count only where given, so that a run begun before they existed resumes."""
        recorded = self.settings.recorded()
        return {name: recorded[name] for name in names
                if not (name in ("chat_template", "draft_chat_template") and recorded[name] is None)} | results

    def open_engine(self):
        from ..engine import Engine

        return Engine(self.settings.target, self.settings.draft, n_ctx=2048, n_threads=self.settings.threads,
                      chat_template=self.settings.chat_template, draft_chat_template=self.settings.draft_chat_template,
                      calibration=None)

    def evaluate_runs(self, engine, problems, runs_text: str, out: Path, title: str) -> dict:
        import click

        from ..evaluation.task_eval import evaluate
        from ..params import GenerationParams
        from ..evaluation.runs import parse_runs

        runs = parse_runs(runs_text, engine.draft_path)

        def progress(items):
            with click.progressbar(items, label=title, file=sys.stderr, show_eta=True) as bar:
                yield from bar

        return evaluate(engine, problems, runs, score_problem, out, GenerationParams(max_tokens=self.settings.max_tokens),
                        self.settings.chat, title, progress=progress)

    def headroom_stage(self, engine) -> dict:
        inputs = self.inputs("target", "draft", "tasks", "chat", "chat_template", "draft_chat_template", "dev", "max_tokens")
        if (done := self.stages.done("headroom", inputs)) is not None:
            return done
        dev = problems_of(self.settings, "dev", self.settings.dev)
        summary = self.evaluate_runs(engine, dev, "target-only,draft-only", self.stages.folder("headroom", inputs),
                                     "headroom (dev)")
        room = headroom(summary)
        room["draft_bytes"] = os.path.getsize(engine.draft_path)
        room["collect_pilot"] = self.collect_pilot(engine, dev[:PILOT_PROBLEMS])
        return self.stages.finish("headroom", inputs, room)

    def collect_pilot(self, engine, problems) -> dict:
        """Collection's cost and yield on a few dev problems, for the estimates: both vary by far more
        between pairs than the target's own time does (0.4 states a problem on the demo pair, 25 on
        SmolLM2 with its arithmetic draft, whose answers part ways at nearly every block)."""
        from ..params import GenerationParams
        from .collect import Collector

        collector = Collector(engine, GenerationParams(max_tokens=self.settings.max_tokens, spec_type=TRAINING_SOURCES),
                              chat=self.settings.chat)
        start, states = time.perf_counter(), []
        for problem in problems:
            states += collector.problem(problem, "dev")[1]
        n = max(len(problems), 1)
        return {"problems": len(problems), "seconds_per_problem": (time.perf_counter() - start) / n,
                "states_per_problem": len(states) / n,
                "decisive_per_problem": sum(s.label >= 0 for s in states) / n}

    def plan_stage(self, room: dict, available: dict[str, list[int | None]]) -> dict:
        """How many train problems: --train, or what fits --minutes; decided once, so a resumed run
        (whose clock starts again) keeps to the same plan."""
        inputs = self.inputs("train", "minutes", "test", "kinds", "grpo", "grpo_steps", headroom=room)
        if self.settings.rounds > 1:  # only where set: runs planned before rounds existed stay resumable
            inputs["rounds"] = self.settings.rounds
        if (done := self.stages.done("plan", inputs)) is not None:
            return done
        n_train = train_problems_for_budget(room, self.settings, available, time.time() - self.t0)
        if n_train == 0:
            one = SplitSizes.plan(available, self.settings, 1)
            raise RecipeStop(f"--minutes {self.settings.minutes:g} leaves no time for training after the headroom "
                             f"check (estimates: {_estimates_text(estimate_seconds(room, self.settings, one))} for "
                             f"one problem a task)")
        sizes = SplitSizes.plan(available, self.settings, n_train)
        return self.stages.finish("plan", inputs, {"train": n_train,
                                                   "estimate": estimate_seconds(room, self.settings, sizes)})

    def run_module(self, module: str, *args: str) -> None:
        """A training step in its own process (llama.cpp and torch never share one)."""
        command = [self.python, "-m", module, *args]
        # The stage ends if this process dies, even by SIGKILL; elsewhere than Linux the finally below
        # covers a clean stop.
        child = subprocess.Popen(command, preexec_fn=die_with_parent)
        try:
            returncode = child.wait()
        finally:  # this process stopped (Ctrl-C, SIGTERM): the stage stops with it, resumable as ever
            if child.poll() is None:
                child.terminate()
                child.wait()
        if returncode == 130 or returncode == -2:
            raise KeyboardInterrupt
        if returncode != 0:
            raise RecipeStop(f"{module} failed (exit {returncode}); rerun the same command to resume: "
                             f"{' '.join(command)}")

    def collect_config(self, out: Path, n_train: int) -> CollectConfig:
        """A plain collection of this run's pair, tasks and chat format into `out`."""
        s = self.settings
        return CollectConfig(out=out, model=s.target, model_draft=s.draft, families=",".join(s.tasks),
                             train=n_train, dev=s.dev, threads=s.threads, max_tokens=s.max_tokens, chat=s.chat,
                             chat_template=s.chat_template, chat_template_draft=s.draft_chat_template)

    def collect_stage(self, n_train: int) -> dict:
        inputs = self.inputs("target", "draft", "tasks", "chat", "chat_template", "draft_chat_template", "dev",
                             "max_tokens", train=n_train)
        if (done := self.stages.done("collect", inputs)) is not None:
            return done
        out = self.stages.folder("collect", inputs)
        self.run_module("cospec_local.train.collect", *config_args(self.collect_config(out, n_train)))
        result = _count_states(out) | {"round": 1, "how": "plain speculative decoding's first mismatches"}
        return self.stages.finish("collect", inputs, result)

    def policy_collect_stage(self, round_: int, n_train: int, warmed: dict) -> dict:
        """Round `round_`'s states: those the last round's chosen arbiter meets as it runs, each
        choice continued by that arbiter (collect.py --policy, two engine processes)."""
        policy = Path(warmed["folder"]) / self.choose(warmed)
        inputs = self.inputs("target", "draft", "tasks", "chat", "chat_template", "draft_chat_template", "dev",
                             "max_tokens", train=n_train, policy=warmed)
        name = f"collect-{round_}"
        if (done := self.stages.done(name, inputs)) is not None:
            return done
        out = self.stages.folder(name, inputs)
        config = replace(self.collect_config(out, n_train), policy=str(policy),
                         workers=max(1, min(2, self.settings.threads)))
        self.run_module("cospec_local.train.collect", *config_args(config))
        result = _count_states(out) | {"round": round_, "how": f"the states the round-{round_ - 1} "
                                                                f"{policy.name} arbiter meets, each choice "
                                                                f"continued by it"}
        return self.stages.finish(name, inputs, result)

    def warmup_stage(self, rounds: list[dict]) -> dict:
        """The arbiters on every round's states so far (round one alone: the stage named warmup)."""
        name = "warmup" if len(rounds) == 1 else f"warmup-{len(rounds)}"
        inputs = self.inputs("kinds", "seed", "device", "name", collect=rounds[0] if len(rounds) == 1 else rounds)
        if (done := self.stages.done(name, inputs)) is not None:
            return done
        counts = {key: sum(r[key] for r in rounds) for key in ("train_decisive", "train_keep_better", "dev_decisive")}
        if (counts["train_decisive"] < MIN_DECISIVE_STATES or counts["train_keep_better"] == 0
                or counts["dev_decisive"] == 0):
            raise RecipeStop(f"{counts['train_decisive']} decisive train states ({counts['train_keep_better']} "
                             f"where keeping the draft's token was better) and {counts['dev_decisive']} decisive "
                             f"dev states: too few to learn a keep decision from (at least {MIN_DECISIVE_STATES} "
                             f"train states, some of them keeps, and one dev state): "
                             f"{more_problems_advice(self.sizes, len(self.settings.tasks))}")
        out = self.stages.folder(name, inputs)
        shutil.rmtree(out, ignore_errors=True)  # a warm-up interrupted half-way starts again: same seed, same result
        s = self.settings
        warmup = WarmupConfig(data=",".join(r["folder"] for r in rounds), out=out, draft=s.draft,
                              arbiters=",".join(s.kinds), threads=s.threads, seed=s.seed, device=s.device, name=s.name)
        self.run_module("cospec_local.train.warmup", *config_args(warmup))
        log = json.loads((out / "warmup_log.json").read_text())
        return self.stages.finish(name, inputs, {"folder": str(out), "dev": {
            kind: log["arbiters"][kind]["dev"] for kind in self.settings.kinds}})

    def gate_stage(self, warmed: dict) -> dict:
        """The warm-up's arbiters, copied, each with a classifier domain gate (fit_gate.py): the
        warm-up's own gate admits only the training wording."""
        inputs = self.inputs("target", "draft", "tasks", "chat", "chat_template", warmup=warmed)
        if (done := self.stages.done("gate", inputs)) is not None:
            return done
        out = self.stages.folder("gate", inputs)
        s = self.settings
        for kind in s.kinds:
            shutil.rmtree(out / kind, ignore_errors=True)
            shutil.copytree(Path(warmed["folder"]) / kind, out / kind)
            gate = GateConfig(arbiter=out / kind, tasks=",".join(s.tasks), model=s.target, model_draft=s.draft,
                              chat=s.chat, chat_template=s.chat_template, train=GATE_PROMPTS_PER_TASK,
                              kind=default_gate_kind(list(s.tasks)))
            self.run_module("cospec_local.train.fit_gate", *config_args(gate))
        return self.stages.finish("gate", inputs, {**warmed, "folder": str(out)})

    def grpo_stage(self, warmed: dict) -> dict | None:
        if not self.settings.grpo:
            return None
        inputs = self.inputs("grpo_steps", "seed", "tasks", "dev", "max_tokens", warmup=warmed)
        if (done := self.stages.done("grpo", inputs)) is not None:
            return done
        out = self.stages.folder("grpo", inputs)
        s = self.settings
        grpo = GRPOConfig(init=Path(warmed["folder"]) / LORA, out=out, target=s.target, draft=s.draft,
                          families=",".join(s.tasks), steps=s.grpo_steps, dev=s.dev, threads=s.threads,
                          max_tokens=s.max_tokens, seed=s.seed)
        self.run_module("cospec_local.train.grpo", *config_args(grpo))
        summary = json.loads((out / "summary.json").read_text())
        return self.stages.finish("grpo", inputs, {"folder": str(out / "best"), "best": summary["best"],
                                                   "sweep": summary.get("sweep")})

    def candidates(self, warmed: dict, grpo: dict | None) -> dict[str, Path]:
        out = {kind: Path(warmed["folder"]) / kind for kind in self.settings.kinds}
        if grpo is not None:
            out["grpo"] = Path(grpo["folder"])
        return out

    def evaluate_stage(self, engine, candidates: dict[str, Path], trained: dict) -> dict:
        inputs = self.inputs("target", "draft", "tasks", "chat", "chat_template", "draft_chat_template", "test",
                             "max_tokens", trained=trained)
        if (done := self.stages.done("evaluate", inputs)) is not None:
            return done
        runs = "target-only,draft-only,sps," + ",".join(f"cospec:{path}" for path in candidates.values())
        folder = self.stages.folder("evaluate", inputs)
        results = {}
        for task in self.settings.tasks:
            test = problems_of(self.settings, "test", self.settings.test, tasks=(task,))
            summary = self.evaluate_runs(engine, test, runs, folder / _slug(task), f"held-out test ({Path(task).name})")
            results[task] = evaluation_entry(summary, {label: label for label in BASELINE_RUNS}
                                             | {f"cospec:{path}": kind for kind, path in candidates.items()})
        return self.stages.finish("evaluate", inputs, results)

    def choose(self, warmed: dict) -> str:
        """The kind the dev split prefers: most right keeps net of wrong ones (ties: lora, which reads the text)."""
        dev = warmed["dev"]
        return max(self.settings.kinds, key=lambda k: (dev[k]["right_keeps"] - dev[k]["wrong_keeps"], k == LORA))

    def install(self, kind: str, source: Path, evaluation: dict, rounds: list[dict], room: dict) -> Path:
        from ..arbiter.file_format import BUNDLE_FILES, set_name
        from ..arbiter.evaluations import EVALUATION_FILE

        dest = self.install_dir / self.settings.name
        tmp = dest.with_name("." + dest.name + ".installing")  # dot folders are not listed as arbiters
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name in BUNDLE_FILES:
            if (source / name).is_file():
                shutil.copyfile(source / name, tmp / name)
        set_name(tmp, self.settings.name)
        record = {"name": self.settings.name, "kind": kind, "recipe": self.settings.recorded(),
                  "headroom": room,
                  "states": rounds[0] if len(rounds) == 1 else {"rounds": [{"round": i + 1} | r
                                                                           for i, r in enumerate(rounds)]},
                  "evaluation": {task: r | {"runs": {label: row for label, row in r["runs"].items()
                                                     if label in (*BASELINE_RUNS, kind)}}
                                 for task, r in evaluation.items()},
                  "installed": time.strftime("%Y-%m-%d %H:%M:%S")}
        (tmp / EVALUATION_FILE).write_text(json.dumps(record, indent=1) + "\n")
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
        return dest

    def run(self) -> Path:
        s = self.settings
        with self.open_engine() as engine:  # refuses a pair that cannot draft through text before anything is written
            for split, n in (("train", 1), ("dev", 1), ("test", 1)):  # and tasks that are empty or malformed
                problems_of(s, split, n)
            if engine.vocab_difference is not None:
                s = self.settings = self.across_vocabularies(engine.vocab_difference)
            self.work.mkdir(parents=True, exist_ok=True)
            room = self.headroom_stage(engine)
        self.say(headroom_report(room))
        if (why := headroom_verdict(room)) is not None:
            if prompt_style(s.target) == "task" and prompt_style(s.draft) == "task":
                why += (". The demo models know only their task families' wording (arith, pyfunc, listops, as "
                        "`cospec-local eval --task arith` writes them): problems worded otherwise give them little "
                        "to part ways on")
            if not s.ignore_headroom:
                raise RecipeStop("no headroom: " + why)
            self.say("note: going on without headroom (--ignore-headroom): " + why)
        available = available_problems(s)  # the task files' rows, read once
        plan = self.plan_stage(room, available)
        n_train = plan["train"]
        self.sizes = SplitSizes.plan(available, s, n_train)
        self.say(f"plan: {self.sizes.text(len(s.tasks))}; estimated "
                 f"{_minutes(sum(plan['estimate'].values()))} ({_estimates_text(plan['estimate'])})")
        if (warning := too_few_states_warning(room, self.sizes, len(s.tasks))) is not None:
            self.say(warning)
        rounds = [self.collect_stage(n_train)]
        self._say_states(rounds[-1])
        warmed = self.warmup_stage(rounds)
        self._say_dev(warmed)
        for round_ in range(2, s.rounds + 1):
            rounds.append(self.policy_collect_stage(round_, n_train, warmed))
            self._say_states(rounds[-1])
            warmed = self.warmup_stage(rounds)
            self._say_dev(warmed)
        warmed = self.gate_stage(warmed)
        grpo = self.grpo_stage(warmed)
        with self.open_engine() as engine:
            evaluation = self.evaluate_stage(engine, self.candidates(warmed, grpo), {"warmup": warmed, "grpo": grpo})
        kind = self.choose(warmed)
        dest = self.install(kind, Path(warmed["folder"]) / kind, evaluation, rounds, room)
        self.say(evaluation_report(evaluation, kind))
        self.say(f"installed {s.name} ({kind}) in {dest}: use it as --arbiter {s.name} "
                 f"(work files in {self.work}; {_minutes(time.time() - self.t0)} in this run)")
        return dest

    def across_vocabularies(self, difference: str) -> RecipeSettings:
        """A draft of another vocabulary drafts through text: the LoRA arbiter, which runs the draft
        over the target's tokens, cannot decide there; the features arbiter can."""
        s = self.settings
        why = f"the draft's vocabulary differs from the target's ({difference}): the LoRA arbiter cannot read the target's tokens"
        if s.grpo:
            raise RecipeStop(f"{why}, and GRPO starts from it: leave out --grpo")
        if FEATURES not in s.kinds:
            raise RecipeStop(f"{why}: use --kinds features")
        if LORA in s.kinds:
            self.say(f"note: {why}; training the features arbiter only")
        return replace(s, kinds=(FEATURES,))

    def _say_states(self, collected: dict) -> None:
        prefix = f"round {collected.get('round', 1)} " if self.settings.rounds > 1 else ""
        self.say(f"{prefix}decision states: {collected['states']}, {collected['decisive']} decisive "
                 f"({collected['keep_better']} where keeping the draft's token was better)")

    def _say_dev(self, warmed: dict) -> None:
        for kind, dev in warmed["dev"].items():
            quiet = " (it never keeps: nothing it learned beats the target on dev)" if dev["threshold"] >= 1.0 else ""
            self.say(f"{kind} arbiter on dev states: threshold {dev['threshold']:.3f}, {dev['right_keeps']} right "
                     f"keeps, {dev['wrong_keeps']} wrong{quiet}")


def _count_states(folder: Path) -> dict:
    """A collection's states, decisive ones (one branch right) and keeps, overall and per split."""
    states = [LabelledState.from_json(json.loads(line))
              for line in (folder / "states.jsonl").read_text().splitlines() if line.strip()]
    return {"folder": str(folder), "states": len(states), "decisive": sum(s.label >= 0 for s in states),
            "keep_better": sum(s.label == 1 for s in states),
            "train_decisive": sum(s.label >= 0 and s.split == "train" for s in states),
            "train_keep_better": sum(s.label == 1 and s.split == "train" for s in states),
            "dev_decisive": sum(s.label >= 0 and s.split == "dev" for s in states)}


def _slug(task: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in Path(task).name)


def _estimates_text(estimate: dict) -> str:
    return ", ".join(f"{name} {_minutes(sec)}" for name, sec in estimate.items() if sec > 0)


def evaluation_report(evaluation: dict, chosen: str) -> str:
    lines = []
    for task, r in evaluation.items():
        lines.append(f"held-out {Path(task).name}: {r['problems']} problems, either model right on "
                     f"{100 * (r['union'] or 0):.1f}%")
        for label, row in r["runs"].items():
            lo, hi = row["accuracy_ci95"]
            extra = ""
            if label not in ("target-only", "draft-only", "sps"):
                extra = (f", recovered {row['recovered']}, lost {row['losses']}, {row['arbiter_keeps']} keeps"
                         + (" (installed)" if label == chosen else ""))
            lines.append(f"  {label:<12} {100 * row['accuracy']:5.1f}% [{100 * lo:.1f}-{100 * hi:.1f}]  "
                         f"{row['speedup'] or 0:.2f}x target-only{extra}")
        if (note := busy_note(r.get("other_load"))) is not None:
            lines.append(f"  warning: {note}")
        if (said := verdict(r["runs"], chosen)) is not None:
            lines.append(f"  verdict: {said.text}")
    return "\n".join(lines)
