"""Family "arith": multi-step word problems in GSM8K's format.

The solution has one worked step per line, e.g. `Tom buys 5 more apples: 3 + 5 = 8`, and ends with
`#### 8`. All quantities are non-negative integers and divisions are exact. Difficulty: `steps`
(operations after the starting amount, 2-4 typical) and `digits` (largest operand width); and,
only when set, `sub_weight`: how often a step subtracts (each step is add 2 : sub 1 : mul 1 :
div 1 by default), so that a training mix can give one model more practice at subtracting.
"""
from __future__ import annotations

import random

from .base import Problem, TaskFamily, score_hash_number

NAMES = ("Tom", "Anna", "Ravi", "Mei", "Lucas", "Sofia", "Omar", "Grace", "Ivan", "Nia", "Pablo", "Yuki",
         "Ben", "Lena", "Kofi", "Emma", "Arjun", "Chloe", "Diego", "Hana")
OBJECTS = ("apples", "marbles", "stickers", "pencils", "cookies", "stamps", "coins", "books", "shells",
           "cards", "beads", "eggs", "candles", "buttons", "plums")


def _op(rng: random.Random, v: int, hi: int, who: str, other: str, obj: str, sub_weight: int = 1):
    """One step applied to the current amount v -> (question sentence, solution line, new value)."""
    divisors = [k for k in range(2, 10) if v % k == 0 and v > 0]
    kinds = ["add", "add"] + ["sub"] * sub_weight + ["mul"] + (["div"] if divisors else [])
    if v == 0:
        kinds = ["add"]
    kind = rng.choice(kinds)
    if kind == "add":
        b = rng.randint(1, hi)
        q = rng.choice((f"Then {who} buys {b} more {obj}.", f"{other} gives {who} {b} {obj}."))
        return q, f"{who} gets {b} more {obj}: {v} + {b} = {v + b}", v + b
    if kind == "sub":
        b = rng.randint(1, min(v, hi))
        q = rng.choice((f"{who} gives {b} {obj} to {other}.", f"{who} loses {b} of the {obj}."))
        return q, f"{who} has {b} fewer {obj}: {v} - {b} = {v - b}", v - b
    if kind == "mul":
        k = rng.randint(2, 5)
        q = rng.choice((f"Then the number of {obj} {who} has becomes {k} times as large.",
                        f"{other} gives {who} enough {obj} to make {who}'s total {k} times what it was."))
        return q, f"The total becomes {k} times as large: {v} * {k} = {v * k}", v * k
    k = rng.choice(divisors)
    q = rng.choice((f"{who} shares the {obj} equally among {k} boxes and keeps only one box.",
                    f"{who} splits the {obj} into {k} equal groups and gives away all groups but one."))
    return q, f"{who} keeps one of {k} equal parts: {v} / {k} = {v // k}", v // k


class Arithmetic(TaskFamily):
    name = "arith"
    default_difficulty = {"steps": 3, "digits": 2}
    optional_difficulty = frozenset({"sub_weight"})

    def make(self, rng: random.Random, difficulty: dict) -> Problem:
        steps, hi = int(difficulty["steps"]), 10 ** int(difficulty["digits"]) - 1
        sub_weight = int(difficulty.get("sub_weight", 1))
        if steps < 1 or hi < 1 or sub_weight < 0:
            raise ValueError(f"arith: steps and digits must be at least 1 and sub_weight at least 0, not {difficulty}")
        who, other = rng.sample(NAMES, 2)
        obj = rng.choice(OBJECTS)
        v = rng.randint(1, hi)
        sentences, lines = [f"{who} has {v} {obj}."], []
        for _ in range(steps):
            q, line, v = _op(rng, v, hi, who, other, obj, sub_weight)
            sentences.append(q)
            lines.append(line)
        sentences.append(f"How many {obj} does {who} have now?")
        return Problem("", self.name, " ".join(sentences), str(v), "\n".join(lines + [f"#### {v}"]),
                       {"steps": steps})

    def score(self, problem: Problem, completion: str) -> bool:
        return score_hash_number(problem.answer, completion)
