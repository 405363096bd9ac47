"""Family "listops": chained list manipulations with exact answers after '####'.

Kept apart from training as the unseen domain for transfer tests: no word-problem story, answers
are lists or integers. Example: "Start with the list [3, 8, 1, 6]. Sort it in ascending order, then
keep only the even numbers, then take the sum. What is the result?" -> one line per operation and
`#### 14`. Difficulty: `ops` (operations in the chain), `length` (list length), `digits`.
"""
from __future__ import annotations

import random
import re

from .base import Problem, TaskFamily, final_answer, score_hash_number


def _fmt(xs: list[int]) -> str:
    return "[" + ", ".join(map(str, xs)) + "]"


def _list_op(rng: random.Random, xs: list[int], hi: int):
    """A list -> list operation that leaves the list non-empty: (instruction, line label, result)."""
    while True:
        kind = rng.choice(("sort", "sort_desc", "reverse", "evens", "odds", "drop_gt", "add", "first"))
        if kind == "sort":
            return "sort it in ascending order", "Sort in ascending order", sorted(xs)
        if kind == "sort_desc":
            return "sort it in descending order", "Sort in descending order", sorted(xs, reverse=True)
        if kind == "reverse":
            return "reverse it", "Reverse", xs[::-1]
        if kind == "add":
            k = rng.randint(1, 9)
            return f"add {k} to every number", f"Add {k} to every number", [x + k for x in xs]
        if kind == "first" and len(xs) > 1:
            k = rng.randint(1, len(xs) - 1)
            return f"keep only the first {k} numbers", f"Keep the first {k}", xs[:k]
        if kind in ("evens", "odds"):
            ys = [x for x in xs if x % 2 == (kind == "odds")]
            word = "odd" if kind == "odds" else "even"
            if ys and len(ys) < len(xs):
                return f"keep only the {word} numbers", f"Keep the {word} numbers", ys
        if kind == "drop_gt":
            t = rng.randint(0, hi)
            ys = [x for x in xs if x <= t]
            if ys and len(ys) < len(xs):
                return f"remove every number greater than {t}", f"Remove the numbers greater than {t}", ys


def _reduce(rng: random.Random, xs: list[int]):
    kind = rng.choice(("sum", "max", "min", "count"))
    if kind == "sum":
        return "take the sum", f"Take the sum: {' + '.join(map(str, xs))} = {sum(xs)}", sum(xs)
    if kind == "max":
        return "take the largest number", f"The largest number of {_fmt(xs)} is {max(xs)}", max(xs)
    if kind == "min":
        return "take the smallest number", f"The smallest number of {_fmt(xs)} is {min(xs)}", min(xs)
    return "count how many numbers are left", f"Count the numbers in {_fmt(xs)}: {len(xs)}", len(xs)


_LIST = re.compile(r"^\[\s*((?:-?\d+\s*,\s*)*-?\d+)?\s*\]\.?$")


def parse_int_list(text: str | None) -> list[int] | None:
    m = _LIST.match((text or "").strip())
    return None if m is None else [int(x) for x in re.findall(r"-?\d+", m.group(1) or "")]


class ListOps(TaskFamily):
    name = "listops"
    default_difficulty = {"ops": 2, "length": 6, "digits": 2}

    def make(self, rng: random.Random, difficulty: dict) -> Problem:
        hi = 10 ** int(difficulty["digits"]) - 1
        xs = [rng.randint(0, hi) for _ in range(int(difficulty["length"]))]
        instructions, lines, value = [], [], xs
        n_ops = int(difficulty["ops"])
        for i in range(n_ops):
            if i == n_ops - 1 and rng.random() < 0.5:  # end on a number half of the time
                text, line, value = _reduce(rng, value)
            else:
                text, label, value = _list_op(rng, value, hi)
                line = f"{label}: {_fmt(value)}"
            instructions.append(text)
            lines.append(line)
        answer = _fmt(value) if isinstance(value, list) else str(value)
        chain = ", then ".join(instructions)
        prompt = f"Start with the list {_fmt(xs)}. {chain[0].upper()}{chain[1:]}. What is the result?"
        return Problem("", self.name, prompt, answer, "\n".join(lines + [f"#### {answer}"]), {"ops": n_ops})

    def score(self, problem: Problem, completion: str) -> bool:
        if problem.answer.startswith("["):
            got = parse_int_list(final_answer(completion))
            return got is not None and got == parse_int_list(problem.answer)
        return score_hash_number(problem.answer, completion)
