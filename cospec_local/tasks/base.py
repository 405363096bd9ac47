"""Problems, task families and the deterministic train/dev/test split machinery.

Splits: every question is assigned to one split by a stable hash of its split key (the question
text, or for code tasks the specification without examples), and a generator for split S keeps
drawing until it has n new questions that hash to S. So the test split never shares a question with
train/dev, for any n and any difficulty, and `generate(split, n)` is a prefix of
`generate(split, n + k)`. Random streams are seeded from sha256(family, split, difficulty), never
from Python's per-process hash().
"""
from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation

SPLITS = ("train", "dev", "test")
_SPLIT_BUCKETS = (("test", 20), ("dev", 30), ("train", 100))  # cumulative percent: 20/10/70
MAX_DRAWS_PER_PROBLEM = 200  # how many candidates may be rejected before the space counts as exhausted


@dataclass(frozen=True)
class Problem:
    id: str
    family: str
    prompt: str  # exactly what the model is asked
    answer: str  # the checkable answer; for code tasks the entry point's name (tests are in meta)
    solution: str  # a worked reference completion in the family's format; score() accepts it
    meta: dict = field(default_factory=dict, hash=False)


def stable_int(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()[:8], "big")


def split_of(key: str) -> str:
    bucket = stable_int("split", key) % 100
    return next(name for name, upper in _SPLIT_BUCKETS if bucket < upper)


class TaskFamily:
    """A generated task family. Subclasses set `name`, `default_difficulty` and implement
    `make(rng, difficulty)` (one candidate problem, id/family filled in later) and `score`."""

    name: str = ""
    default_difficulty: dict = {}
    # Keys a caller may set that stay out of the difficulty (and so out of the problems' random
    # stream and ids) unless set: adding one never changes an existing split.
    optional_difficulty: frozenset = frozenset()

    def make(self, rng: random.Random, difficulty: dict) -> Problem:
        raise NotImplementedError

    def score(self, problem: Problem, completion: str) -> bool:
        raise NotImplementedError

    def split_key(self, problem: Problem) -> str:
        return problem.prompt

    def capacity(self, split: str, difficulty: dict | None = None) -> int | None:
        """How many distinct problems `split` holds (None: more than any run asks for)."""
        return None

    def distinct_key(self, problem: Problem) -> str:
        """What makes two problems of a split different (default: the split key)."""
        return self.split_key(problem)

    def difficulty(self, difficulty: dict | None) -> dict:
        unknown = set(difficulty or {}) - set(self.default_difficulty) - self.optional_difficulty
        if unknown:
            raise ValueError(f"{self.name}: unknown difficulty keys {sorted(unknown)}")
        return {**self.default_difficulty, **(difficulty or {})}

    def generate(self, split: str, n: int, difficulty: dict | None = None, *, distinct: bool = True) -> list[Problem]:
        """n problems of `split`, deterministic for (family, split, difficulty). distinct=False lets
        questions repeat (with new example values where the family has them): for training pools
        larger than a small family's question space."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
        diff = self.difficulty(difficulty)
        tag = json.dumps(diff, sort_keys=True)
        rng = random.Random(stable_int(self.name, split, tag))
        out: list[Problem] = []
        seen: set[str] = set()
        draws = 0
        while len(out) < n:
            draws += 1
            if draws > MAX_DRAWS_PER_PROBLEM * (n + 10):
                raise ValueError(f"{self.name}: only {len(out)} distinct {split} problems found for {tag}")
            p = self.make(rng, diff)
            key, distinct_key = self.split_key(p), self.distinct_key(p)
            if (distinct and distinct_key in seen) or split_of(key) != split:
                continue
            seen.add(distinct_key)
            pid = f"{self.name}-{split}-{len(out):05d}-{stable_int(tag, key) % 16**8:08x}"
            out.append(Problem(pid, self.name, p.prompt, p.answer, p.solution, {**p.meta, "difficulty": diff}))
        return out


# ---- "#### answer" convention (GSM8K), shared by the arithmetic families and GSM8K itself ----

_HASH_ANSWER = re.compile(r"####[ \t]*(.*)")


def final_answer(text: str) -> str | None:
    """The text after the last '####' on its line, or None when there is no '####'."""
    hits = _HASH_ANSWER.findall(text)
    return hits[-1].strip() if hits else None


_NUMBER = re.compile(r"^\$?\s*([-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+)\s*\.?$")


def parse_number(text: str | None) -> Decimal | None:
    """'1,234', '$8', '8.0', '-3' -> Decimal; anything else (including '8 apples') -> None."""
    m = _NUMBER.match((text or "").strip())
    if not m:
        return None
    try:
        return Decimal(m.group(1).replace(",", ""))
    except InvalidOperation:
        return None


def score_hash_number(expected: str, completion: str) -> bool:
    """GSM8K rule: the number after the last '####' equals the expected number."""
    got, want = parse_number(final_answer(completion)), parse_number(expected)
    return got is not None and want is not None and got == want
