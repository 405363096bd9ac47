"""Verifiable tasks for evaluating draft/target pairs: every problem has an exact, checkable answer.

    from cospec_local.tasks import load_task, score
    problems = load_task("arith", "dev", limit=50)            # generated family
    problems = load_task("data/gsm8k_test.jsonl", limit=100)  # benchmark file, format from its fields
    ok = score(problems[0], completion)

Generated families (TASKS): "arith" and "pyfunc" for training/evaluation, "listops" kept apart as
the unseen domain, and twelve short-answer families (short_answer.py: facts, words, numbers, each
asked in several wordings and formats). "general" names the built-in training mix (GENERAL_MIX):
the short-answer families with arithmetic and code. Benchmarks (BENCHMARKS): gsm8k, math500, mbpp,
humaneval, from local jsonl files.
"""
from __future__ import annotations

from pathlib import Path

from .arithmetic import Arithmetic
from .base import SPLITS, Problem, TaskFamily, final_answer, parse_number, split_of, stable_int
from .benchmarks import BENCHMARKS, Benchmark, detect, last_boxed, math_equal, normalize_math, read_jsonl
from .listops import ListOps
from .pyfunc import PyFunc
from .short_answer import FAMILIES as SHORT_ANSWER_FAMILIES
from .short_answer import ShortAnswer

TASKS: dict[str, TaskFamily] = {t.name: t for t in (Arithmetic(), PyFunc(), ListOps(), *SHORT_ANSWER_FAMILIES)}
TRAIN_FAMILIES = ("arith", "pyfunc")
TRANSFER_FAMILIES = ("listops",)  # never used for training: measures transfer to an unseen domain
# The mix `arbiter train` learns from where no task is named: disagreements of many kinds (facts,
# words, numbers, worked arithmetic, code), each asked in several wordings and formats, so that an
# arbiter learns how the two models disagree rather than one task's content. Listops, and the
# capitals, antonyms and plurals the shipped Gemma arbiters were measured on, stay out of it.
MIX = "general"
GENERAL_MIX = (*(f.name for f in SHORT_ANSWER_FAMILIES), "arith", "pyfunc")
DEFAULT_N = 200  # problems drawn from a generated family when no limit is given
# Where a plain (non-chat) completion of each family ends: answers end with a
# "#### N" line, code with the function (HumanEval's own stop sequences).
FAMILY_STOPS = {
    "arith": ["\n\n"], "listops": ["\n\n"], "gsm8k": ["\n\n"],
    "pyfunc": ["\ndef ", "\nclass ", "\nif __name__", "\nprint("],
    "humaneval": ["\ndef ", "\nclass ", "\nif __name__", "\nprint("],
    "mbpp": ["[DONE]"],
    # (No stop for the short-answer families: a base model often opens a raw question's reply with a
    # blank line, which any line stop would end it at. They are scored on the first non-empty line,
    # and their replies are bounded by the token budget.)
}


def expand_tasks(names) -> tuple[str, ...]:
    """Task names with the mix's name replaced by its families (each once, in order)."""
    out: list[str] = []
    for name in names:
        for task in (GENERAL_MIX if str(name) == MIX else (name,)):
            if task not in out:
                out.append(task)
    return tuple(out)


def cut_at_stops(text: str, stops) -> str:
    """`text` up to the first of `stops` it contains (the engine ends a generation there too)."""
    ends = [text.find(s) for s in stops if s and s in text]
    return text[:min(ends)] if ends else text


def get_task(name: str) -> TaskFamily | Benchmark:
    if name in TASKS:
        return TASKS[name]
    if name in BENCHMARKS:
        return BENCHMARKS[name]
    raise KeyError(f"unknown task {name!r}; known: {sorted(TASKS) + sorted(BENCHMARKS)}")


def load_task(name_or_file: str | Path, split: str | None = None, limit: int | None = None,
              difficulty: dict | None = None) -> list[Problem]:
    """Problems of a generated family (by name), or of a task file (a .jsonl/.jsonl.gz path, its
    format told by the fields of its first row; `difficulty` does not apply to files). A family's
    split defaults to test. A file's
    rows are all read with split=None; with a split, only the rows whose prompt hashes to it (the
    families' 70/10/20 rule), so training on a file's train split never sees its dev or test rows."""
    if str(name_or_file) in TASKS:
        return TASKS[str(name_or_file)].generate(split or "test", DEFAULT_N if limit is None else limit, difficulty)
    path = Path(name_or_file)
    if not path.is_file():
        raise FileNotFoundError(f"{name_or_file!r} is neither a task ({sorted(TASKS)}) nor a file; "
                                f"benchmarks ({sorted(BENCHMARKS)}) are read from local jsonl files")
    if split is not None and split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
    first = read_jsonl(path, 1)
    if not first:
        return []
    try:
        fmt = detect(first[0])
    except ValueError as exc:
        raise ValueError(f"{path}:1: {exc}") from None
    problems = fmt.load(path, limit if split is None else None)
    if split is not None:
        problems = [p for p in problems if split_of(p.prompt) == split]
    return problems if limit is None else problems[:limit]


def score(problem: Problem, completion: str) -> bool:
    """Score a completion with the scorer of the problem's family (generated or benchmark)."""
    return get_task(problem.family).score(problem, completion)


__all__ = ["Problem", "TaskFamily", "ShortAnswer", "Benchmark", "TASKS", "BENCHMARKS", "SPLITS", "TRAIN_FAMILIES",
           "MIX", "GENERAL_MIX", "expand_tasks",
           "TRANSFER_FAMILIES", "DEFAULT_N", "FAMILY_STOPS", "cut_at_stops", "get_task", "load_task", "score", "final_answer", "parse_number",
           "split_of", "stable_int", "last_boxed", "normalize_math", "math_equal", "read_jsonl", "detect",
           "Arithmetic", "PyFunc", "ListOps"]
