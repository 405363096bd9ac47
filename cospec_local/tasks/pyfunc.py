"""Family "pyfunc": small Python functions, HumanEval style.

The prompt is a signature plus a docstring with one example; the model writes the body (see
`code.build_program` for the completion convention). Hidden tests (meta["tests"], 4 asserts) run
only in the sandbox. Each template carries a plausible buggy body, and the tests are drawn until at
least one of them tells the bug apart, so the tests are known to catch near-misses.
Difficulty: `level` 1 (one condition) or 2 (two conditions / loops).

Expected values are computed in-process by the templates' own Python lambdas (trusted code);
generated code is never run here.
"""
from __future__ import annotations

import random
import string
from dataclasses import dataclass
from typing import Callable

from .base import Problem, TaskFamily
from .code import build_program, run_tests


def _ints(rng, lo=-20, hi=50, n=(3, 8), must=()):
    xs = [rng.randint(lo, hi) for _ in range(rng.randint(*n))] + list(must)
    rng.shuffle(xs)
    return xs


def _words(rng, n=(2, 6)):
    return " ".join("".join(rng.choices(string.ascii_lowercase[:12], k=rng.randint(1, 9)))
                    for _ in range(rng.randint(*n)))


@dataclass(frozen=True)
class Template:
    names: tuple[str, ...]  # function name choices
    params: tuple[str, ...]  # parameter name choices: {p} in doc, body and bug
    doc: str  # formatted with the constants
    body: str  # reference body, formatted with the constants
    bug: str  # a plausible wrong body, for near-miss tests
    consts: Callable[[random.Random], dict]
    args: Callable[[random.Random, dict], tuple]  # one random argument tuple
    ref: Callable[..., object]  # ref(c, *args)
    wrong: Callable[..., object]  # the bug, as a lambda: used to make sure the tests catch it
    level: int = 1


LISTS, TEXTS = ("xs", "nums", "values"), ("s", "text", "line")

TEMPLATES = (
    Template(("sum_multiples", "total_divisible", "add_multiples", "sum_divisible"), LISTS,
             "Return the sum of the numbers in {p} that are divisible by {k}.",
             "return sum(x for x in {p} if x % {k} == 0)", "return sum(x for x in {p}[1:] if x % {k} == 0)",
             lambda r: {"k": r.randint(2, 19)}, lambda r, c: (_ints(r, must=[c["k"] * r.randint(1, 3)]),),
             lambda c, xs: sum(x for x in xs if x % c["k"] == 0),
             lambda c, xs: sum(x for x in xs[1:] if x % c["k"] == 0)),
    Template(("count_letter", "letter_count", "occurrences", "count_char"), TEXTS,
             "Return how many times the letter '{ch}' occurs in {p}, counting upper and lower case.",
             "return {p}.lower().count('{ch}')", "return {p}.count('{ch}')",
             lambda r: {"ch": r.choice(string.ascii_lowercase)},
             lambda r, c: ("".join(r.choices("abcdefgh" + c["ch"] + c["ch"].upper(), k=r.randint(4, 14))),),
             lambda c, s: s.lower().count(c["ch"]), lambda c, s: s.count(c["ch"])),
    Template(("max_pair_sum", "best_pair_total", "largest_pair_sum", "top_pair_sum"), ("pairs", "items", "tuples"),
             "Return the largest a + b over the pairs (a, b) in {p}, or {d} if {p} is empty.",
             "return max((a + b for a, b in {p}), default={d})", "return max((max(a, b) for a, b in {p}), default={d})",
             lambda r: {"d": r.randint(-20, 0)},
             lambda r, c: ([(r.randint(-9, 30), r.randint(-9, 30)) for _ in range(r.randint(0, 5))],),
             lambda c, p: max((a + b for a, b in p), default=c["d"]),
             lambda c, p: max((max(a, b) for a, b in p), default=c["d"])),
    Template(("count_above", "how_many_greater", "count_greater", "num_above"), LISTS,
             "Return how many numbers in {p} are greater than {t}.",
             "return sum(1 for x in {p} if x > {t})", "return sum(1 for x in {p} if x >= {t})",
             lambda r: {"t": r.randint(-50, 100)}, lambda r, c: (_ints(r, c["t"] - 15, c["t"] + 15, must=[c["t"]]),),
             lambda c, xs: sum(1 for x in xs if x > c["t"]), lambda c, xs: sum(1 for x in xs if x >= c["t"])),
    Template(("clamp_all", "limit_values", "clip_list", "bound_all"), LISTS,
             "Return a new list in which every number of {p} is limited to the range from {lo} to {hi}, inclusive.",
             "return [min(max(x, {lo}), {hi}) for x in {p}]", "return [x for x in {p} if {lo} <= x <= {hi}]",
             lambda r: (lambda lo: {"lo": lo, "hi": lo + r.randint(5, 30)})(r.randint(-10, 10)),
             lambda r, c: (_ints(r, c["lo"] - 10, c["hi"] + 10, must=[c["hi"] + 1]),),
             lambda c, xs: [min(max(x, c["lo"]), c["hi"]) for x in xs],
             lambda c, xs: [x for x in xs if c["lo"] <= x <= c["hi"]]),
    Template(("every_kth", "take_every", "stride_chars", "sample_chars"), TEXTS,
             "Return the characters of {p} at positions 0, {k}, {k2}, ... (every {k} positions) as one string.",
             "return {p}[::{k}]", "return {p}[{k} - 1::{k}]",
             lambda r: (lambda k: {"k": k, "k2": 2 * k})(r.randint(2, 9)),
             lambda r, c: ("".join(r.choices(string.ascii_lowercase, k=r.randint(c["k"] + 1, 24))),),
             lambda c, s: s[::c["k"]], lambda c, s: s[c["k"] - 1::c["k"]]),
    Template(("reverse_long_words", "flip_long_words", "mirror_long_words", "invert_long_words"), TEXTS,
             "Return {p} with every word longer than {n} characters reversed. Words are separated by single spaces.",
             'return " ".join(w[::-1] if len(w) > {n} else w for w in {p}.split(" "))',
             'return " ".join(w[::-1] if len(w) >= {n} else w for w in {p}.split(" "))',
             lambda r: {"n": r.randint(2, 7)}, lambda r, c: (_words(r),),
             lambda c, s: " ".join(w[::-1] if len(w) > c["n"] else w for w in s.split(" ")),
             lambda c, s: " ".join(w[::-1] if len(w) >= c["n"] else w for w in s.split(" ")), level=2),
    Template(("sum_selected", "add_matching", "selected_total", "filtered_sum"), LISTS,
             "Return the sum of the numbers in {p} that are divisible by {k} and greater than {t}.",
             "return sum(x for x in {p} if x % {k} == 0 and x > {t})",
             "return sum(x for x in {p} if x % {k} == 0 and x >= {t})",
             lambda r: (lambda k: {"k": k, "t": k * r.choice([i for i in range(-5, 21) if i])})(r.randint(2, 9)),
             lambda r, c: (_ints(r, c["t"] - 20, c["t"] + 30, must=[c["t"]]),),
             lambda c, xs: sum(x for x in xs if x % c["k"] == 0 and x > c["t"]),
             lambda c, xs: sum(x for x in xs if x % c["k"] == 0 and x >= c["t"]), level=2),
    Template(("unique_below", "first_small_values", "distinct_under", "small_uniques"), LISTS,
             "Return the numbers of {p} that are smaller than {t}, without repeats, in order of first appearance.",
             "seen = []\n    for x in {p}:\n        if x < {t} and x not in seen:\n"
             "            seen.append(x)\n    return seen",
             "return sorted(set(x for x in {p} if x < {t}))",
             lambda r: {"t": r.randint(-50, 100)}, lambda r, c: (_ints(r, c["t"] - 12, c["t"] + 5, n=(4, 9)) * 2,),
             lambda c, xs: list(dict.fromkeys(x for x in xs if x < c["t"])),
             lambda c, xs: sorted(set(x for x in xs if x < c["t"])), level=2),
    Template(("count_pairs", "pairs_with_sum", "matching_pairs", "sum_pair_count"), LISTS,
             "Return how many pairs of positions i < j have {p}[i] + {p}[j] == {t}.",
             "return sum(1 for i in range(len({p})) for j in range(i + 1, len({p})) if {p}[i] + {p}[j] == {t})",
             "return sum(1 for i in range(len({p})) for j in range(len({p})) if i != j and {p}[i] + {p}[j] == {t})",
             lambda r: {"t": r.randint(-20, 80)},
             lambda r, c: (_ints(r, c["t"] // 2 - 10, c["t"] // 2 + 10, n=(4, 9), must=[c["t"] - 3, 3]),),
             lambda c, xs: sum(1 for i in range(len(xs)) for j in range(i + 1, len(xs)) if xs[i] + xs[j] == c["t"]),
             lambda c, xs: sum(1 for i in range(len(xs)) for j in range(len(xs)) if i != j and xs[i] + xs[j] == c["t"]),
             level=2),
)


def _call(name: str, args: tuple) -> str:
    return f"{name}({', '.join(map(repr, args))})"


class PyFunc(TaskFamily):
    name = "pyfunc"
    default_difficulty = {"level": 1}
    n_tests = 4

    def make(self, rng: random.Random, difficulty: dict) -> Problem:
        templates = [t for t in TEMPLATES if t.level == int(difficulty["level"])]
        if not templates:
            raise ValueError(f"pyfunc: level must be one of {sorted({t.level for t in TEMPLATES})}")
        t = rng.choice(templates)
        name, param, c = rng.choice(t.names), rng.choice(t.params), t.consts(rng)
        example = t.args(rng, c)
        spec = t.doc.format(p=param, **c)
        prompt = (f"def {name}({param}):\n    \"\"\"{spec}\n\n    >>> {_call(name, example)}\n"
                  f"    {t.ref(c, *example)!r}\n    \"\"\"\n")
        cases = [t.args(rng, c) for _ in range(self.n_tests)]
        for _ in range(100):  # make sure the tests catch the template's bug
            if any(t.ref(c, *a) != t.wrong(c, *a) for a in cases):
                break
            cases[rng.randrange(len(cases))] = t.args(rng, c)
        else:
            raise RuntimeError(f"tests cannot tell the bug of {name} apart")
        tests = [f"assert {_call(name, a)} == {t.ref(c, *a)!r}" for a in cases]
        body, bug = t.body.format(p=param, **c), t.bug.format(p=param, **c)
        return Problem("", self.name, prompt, name, f"    {body}\n",
                       {"entry_point": name, "tests": tests, "spec": spec, "bug": f"    {bug}\n"})

    def split_key(self, problem: Problem) -> str:
        return problem.prompt.split(">>>")[0]  # signature and spec: a new example is not a new question

    def score(self, problem: Problem, completion: str, timeout: float = 5.0) -> bool:
        program = build_program(completion, problem.prompt, problem.meta["entry_point"])
        return run_tests(program, "\n".join(problem.meta["tests"]), timeout).passed
