"""Generated task families, split discipline, scorers, and the benchmark loaders."""
from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
import time

import pytest

from cospec_local.tasks import (BENCHMARKS, TASKS, Problem, get_task, last_boxed, load_task, math_equal,
                                normalize_math, parse_number, score, split_of)
from cospec_local.tasks.code import build_program
from cospec_local.tasks.short_answer import FAMILIES as SHORT_ANSWER_FAMILIES

DIFFICULTIES = {"arith": [{}, {"steps": 4, "digits": 1}], "pyfunc": [{}, {"level": 2}],
                "listops": [{}, {"ops": 3, "length": 8}]}
# (The short-answer families ask an item in several wordings, so their splits hold an item more
# than once: tests/test_short_answer_tasks.py holds them to their own rules.)
FAMILIES = sorted(DIFFICULTIES)


# ---------------------------------------------------------------- splits and determinism

@pytest.mark.parametrize("name", FAMILIES)
def test_generation_is_deterministic_and_prefix_stable(name):
    task = TASKS[name]
    for diff in DIFFICULTIES[name]:
        a, b = task.generate("dev", 40, diff), task.generate("dev", 40, diff)
        assert a == b
        assert task.generate("dev", 15, diff) == a[:15]
        assert len({p.id for p in a}) == 40 and all(p.family == name for p in a)


@pytest.mark.parametrize("name", FAMILIES)
def test_test_split_is_disjoint_from_train_and_dev(name):
    task = TASKS[name]
    for diff in DIFFICULTIES[name]:
        sets = {s: task.generate(s, n, diff) for s, n in (("train", 300), ("dev", 100), ("test", 100))}
        keys = {s: {task.split_key(p) for p in ps} for s, ps in sets.items()}
        prompts = {s: {p.prompt for p in ps} for s, ps in sets.items()}
        assert all(len(keys[s]) == len(sets[s]) for s in sets)  # no repeats within a split
        assert not keys["test"] & (keys["train"] | keys["dev"]) and not keys["train"] & keys["dev"]
        assert not prompts["test"] & (prompts["train"] | prompts["dev"])
        assert all(split_of(task.split_key(p)) == s for s, ps in sets.items() for p in ps)


def test_questions_of_other_difficulties_keep_their_split():
    # a question text that two difficulties can both produce lands in the same split for both
    task = TASKS["listops"]
    test_keys = {task.split_key(p) for p in task.generate("test", 200, {"length": 3, "digits": 1, "ops": 1})}
    train_keys = {task.split_key(p) for p in task.generate("train", 400, {"length": 3, "digits": 1, "ops": 1})}
    assert test_keys and not test_keys & train_keys


# scripts/sanitize.sh runs the suite with the ASan runtime preloaded: a child importing the extension needs it too.
SANITIZER_ENV = {k: v for k, v in os.environ.items() if k in ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS")}


def test_seeds_do_not_depend_on_python_hash_randomisation():
    code = ("from cospec_local.tasks import TASKS\n"
            "print([(p.id, p.prompt) for n in sorted(TASKS) for p in TASKS[n].generate('test', 5)])")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin", **SANITIZER_ENV}).stdout
            for seed in ("1", "987")}
    assert len(outs) == 1
    assert outs.pop().strip() == repr([(p.id, p.prompt) for n in sorted(TASKS) for p in TASKS[n].generate("test", 5)])


def test_bad_split_or_difficulty_is_refused():
    with pytest.raises(ValueError):
        TASKS["arith"].generate("validation", 5)
    with pytest.raises(ValueError):
        TASKS["arith"].generate("train", 5, {"stepz": 3})
    with pytest.raises(ValueError):
        TASKS["pyfunc"].generate("train", 5, {"level": 9})


# ---------------------------------------------------------------- arith

_STEP = re.compile(r"^.+: (\d+) ([-+*/]) (\d+) = (\d+)$")


@pytest.mark.parametrize("diff", [{"steps": 2, "digits": 1}, {"steps": 3, "digits": 2}, {"steps": 4, "digits": 3}])
def test_arith_solutions_are_correct_chains(diff):
    ops = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "/": lambda a, b: a / b}
    for p in TASKS["arith"].generate("train", 100, diff):
        *steps, last = p.solution.splitlines()
        assert len(steps) == diff["steps"] and last == f"#### {p.answer}"
        value = int(re.search(r"has (\d+) ", p.prompt).group(1))
        for line in steps:
            a, op, b, c = _STEP.match(line).groups()
            assert int(a) == value and ops[op](int(a), int(b)) == int(c) >= 0
            value = int(c)
        assert value == int(p.answer)
        if diff["digits"] == 1:
            assert all(int(n) <= 9 for n in re.findall(r"\d+", p.prompt))


def test_arith_sub_weight_is_optional_and_shifts_the_operations():
    """sub_weight, not given, leaves every existing problem (ids included) as it was; given, it
    raises the share of subtraction steps."""
    task = TASKS["arith"]
    assert task.difficulty(None) == {"steps": 3, "digits": 2}  # not in the tag unless set
    plain = task.generate("train", 300)
    heavy = task.generate("train", 300, {"sub_weight": 8})
    assert plain == task.generate("train", 300, {})
    # the first test problem keeps the id its eval records carry (bench/demo_pair_eval) from before the key existed
    assert task.generate("test", 1)[0].id == "arith-test-00000-d1f9f058"

    def share(problems):
        ops = [_STEP.match(line).group(2) for p in problems for line in p.solution.splitlines()[:-1]]
        return ops.count("-") / len(ops)

    assert share(plain) < 0.3 < 0.55 < share(heavy)
    assert all(split_of(task.split_key(p)) == "train" for p in heavy)
    with pytest.raises(ValueError):
        task.generate("train", 5, {"sub_weight": -1})


def test_arith_scorer_accepts_solutions_and_rejects_near_misses():
    task = TASKS["arith"]
    problems = task.generate("train", 200)
    assert all(task.score(p, p.solution) for p in problems)
    for p in problems:
        body = p.solution.rsplit("####", 1)[0]
        assert not task.score(p, body + f"#### {int(p.answer) + 1}")
        assert not task.score(p, body + f"#### {int(p.answer) - 1}")
        assert not task.score(p, p.solution.replace("#### ", ""))  # the final number alone is not enough
        assert not task.score(p, body + f"#### {p.answer} apples")
        assert task.score(p, body + f"The answer is {p.answer}.\n#### {int(p.answer):,}")
        assert task.score(p, f"#### 0\nLet me redo that.\n#### {p.answer}.0")  # the last #### counts


def test_number_parsing():
    assert parse_number("1,234") == 1234 and parse_number("$8") == 8 and parse_number("-3") == -3
    assert parse_number("8.50") == parse_number("8.5")
    assert parse_number("12,34") is None and parse_number("8 apples") is None and parse_number(None) is None


# ---------------------------------------------------------------- listops

def test_listops_scorer_accepts_solutions_and_rejects_near_misses():
    task = TASKS["listops"]
    problems = task.generate("test", 200, {"ops": 3})
    assert all(task.score(p, p.solution) for p in problems)
    kinds = {p.answer.startswith("[") for p in problems}
    assert kinds == {True, False}
    for p in problems:
        body = p.solution.rsplit("####", 1)[0]
        assert len(p.solution.splitlines()) == 4
        assert not task.score(p, body.rstrip())
        if p.answer.startswith("["):
            xs = json.loads(p.answer)
            assert not task.score(p, body + f"#### {[xs[0] + 1] + xs[1:]}")
            assert not task.score(p, body + f"#### {xs + [0]}")
            if xs != xs[::-1]:
                assert not task.score(p, body + f"#### {xs[::-1]}")  # order matters
            assert task.score(p, body + f"#### [{','.join(map(str, xs))}]")
        else:
            assert not task.score(p, body + f"#### {int(p.answer) + 1}")


# ---------------------------------------------------------------- pyfunc

def _pyfunc_problems():
    task = TASKS["pyfunc"]
    return task.generate("train", 100, {"level": 1}) + task.generate("train", 100, {"level": 2})


def test_pyfunc_prompts_are_valid_stubs_with_hidden_tests():
    for p in _pyfunc_problems():
        entry = p.meta["entry_point"]
        assert p.prompt.startswith(f"def {entry}(") and p.prompt.endswith('    """\n')
        assert ">>>" in p.prompt and 3 <= len(p.meta["tests"]) <= 5
        assert all(t.startswith(f"assert {entry}(") and t not in p.prompt for t in p.meta["tests"])
        compile(p.prompt + p.solution, "<reference>", "exec")  # syntax only: nothing is run in-process


@pytest.mark.slow
def test_pyfunc_scorer_accepts_solutions_and_rejects_buggy_bodies():
    task = TASKS["pyfunc"]
    problems = _pyfunc_problems()
    assert all(task.score(p, p.solution) for p in problems)
    assert not any(task.score(p, p.meta["bug"]) for p in problems)
    assert not task.score(problems[0], "    pass\n")


@pytest.mark.slow
def test_pyfunc_completion_conventions():
    task = TASKS["pyfunc"]
    p = task.generate("dev", 1, {"level": 2})[0]
    entry, body = p.meta["entry_point"], p.solution
    signature = p.prompt.splitlines()[0]
    unindented = "\n".join(line[4:] for line in body.splitlines())
    accepted = {
        "raw body": body,
        "raw full function": f"{signature}\n{body}",
        "fenced full function": f"Here you go:\n```python\n{signature}\n{body}```\nDone.",
        "fenced body": f"```\n{unindented}\n```",
        "unclosed fence": f"```python\n{signature}\n{body}",
        "main block is not run": body + "\nif __name__ == '__main__':\n    input()\n",
        "closing fence after body": body + "```\nThis returns the result.",
    }
    for label, completion in accepted.items():
        assert task.score(p, completion), label
    rejected = {
        "bug in a fence": f"```python\n{signature}\n{p.meta['bug']}```",
        "stray exit before the tests": "    pass\nimport sys\nsys.exit(0)\n",
        "syntax error": "    return (\n",
        "empty": "",
    }
    for label, completion in rejected.items():
        assert not task.score(p, completion), label
    start = time.monotonic()
    assert not task.score(p, "    while True:\n        pass\n", timeout=1.0)
    assert time.monotonic() - start < 5
    assert build_program(f"```python\n{signature}\n{body}```", p.prompt, entry).startswith(p.prompt)


# ---------------------------------------------------------------- MATH normalisation

@pytest.mark.parametrize("given, expected", [
    ("\\frac{1}{2}", "0.5"), ("\\dfrac12", "\\frac{1}{2}"), ("\\tfrac{3}{4}", "0.75"), ("1/2", "\\frac12"),
    ("-\\frac{3}{4}", "-0.75"), ("\\frac{-3}{4}", "-\\frac34"), ("10\\%", "10"), ("90^\\circ", "90"),
    ("90^{\\circ}", "90"), ("5\\text{ cm}", "5"), ("\\frac{1}{2}\\text{ inches}", "0.5"), ("\\text{(C)}", "(C)"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})"), ("x = 5", "5"), ("10,\\!000", "10000"),
    ("1{,}000", "1000"), ("\\$18.90", "18.9"), ("3.", "3"), ("\\sqrt3", "\\sqrt{3}"), (".5", "\\frac{1}{2}"),
    ("\\frac{\\sqrt3}{2}", "\\dfrac{\\sqrt{3}}{2}"), ("$2$", "2"), ("\\! 4\\,\\!", "4"),
])
def test_math_equivalent_answers(given, expected):
    assert math_equal(given, expected) and math_equal(expected, given)


@pytest.mark.parametrize("given, expected", [
    ("\\frac{1}{3}", "0.33"), ("2", "3"), ("\\frac{1}{2}", "\\frac{1}{3}"), ("(3,4)", "[3,4]"),
    ("\\sqrt{2}", "\\sqrt{3}"), ("-5", "5"), ("10", "100"), ("\\frac{2}{0}", "0"),
])
def test_math_different_answers(given, expected):
    assert not math_equal(given, expected)


def test_last_boxed_handles_nesting_and_edge_cases():
    assert last_boxed("so $\\boxed{\\frac{1}{\\sqrt{2}}}$.") == "\\frac{1}{\\sqrt{2}}"
    assert last_boxed("\\boxed{1} then \\boxed{\\{2, 3\\}}") == "\\{2, 3\\}"
    assert last_boxed("\\boxed{{a}{b}}") == "{a}{b}"
    assert last_boxed("answer: \\boxed 5$") == "5"
    assert last_boxed("\\fbox{7}") == "7"
    assert last_boxed("\\boxed{\\frac{1}{2}") is None  # cut off
    assert last_boxed("no box here: 5") is None
    assert normalize_math("\\left[ 2, 3 \\right)") == "[2,3)"


# ---------------------------------------------------------------- benchmark loaders

def _write_jsonl(path, rows, gz=False):
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


GSM8K_ROWS = [
    {"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
                 "How many clips did Natalia sell altogether in April and May?",
     "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips "
               "altogether in April and May.\n#### 72"},
    {"question": "A shop sells 1,200 pens a week for 2 weeks. How many pens?",
     "answer": "1200 * 2 = <<1200*2=2400>>2400\n#### 2,400"},
]
MATH_ROWS = [
    {"problem": "What is $\\frac{2}{4}$ in lowest terms?", "solution": "Divide by 2: $\\boxed{\\frac{1}{2}}$.",
     "answer": "\\frac{1}{2}", "subject": "Prealgebra", "level": 1, "unique_id": "test/prealgebra/1.json"},
    {"problem": "Find the angle.", "solution": "It is $\\boxed{90^\\circ}$.", "answer": "90^\\circ",
     "subject": "Geometry", "level": 2, "unique_id": "test/geometry/2.json"},
]
MBPP_ROWS = [
    {"task_id": 2, "text": "Write a function to find the shared elements from the given two lists.",
     "code": "def similar_elements(test_tup1, test_tup2):\r\n"
             "  res = tuple(set(test_tup1) & set(test_tup2))\r\n  return (res) ",
     "test_list": ["assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))",
                   "assert set(similar_elements((1, 2, 3, 4),(5, 4, 3, 7))) == set((3, 4))"],
     "test_setup_code": "", "challenge_test_list": []},
    {"task_id": 9, "text": "Write a python function to find the square root of n using math.",
     "code": "import math\ndef root(n):\n    return math.sqrt(n)",
     "test_list": ["assert root(16) == 4", "assert root(2.25) == 1.5", "assert root(0) == 0"],
     "test_setup_code": "import math", "challenge_test_list": []},
]
HUMANEVAL_ROWS = [
    {"task_id": "Toy/0", "entry_point": "add",
     "prompt": "from typing import List\n\n\ndef add(xs: List[int], k: int) -> List[int]:\n"
               "    \"\"\" Add k to every element.\n    >>> add([1, 2], 3)\n    [4, 5]\n    \"\"\"\n",
     "canonical_solution": "    return [x + k for x in xs]\n",
     "test": "\n\nMETADATA = {}\n\n\ndef check(candidate):\n    assert candidate([1, 2], 3) == [4, 5]\n"
             "    assert candidate([], 7) == []\n    assert candidate([-1], 1) == [0]\n"},
]


def test_gsm8k_loader_and_scorer(tmp_path):
    problems = load_task(_write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K_ROWS))
    assert [p.family for p in problems] == ["gsm8k", "gsm8k"] and [p.answer for p in problems] == ["72", "2400"]
    assert problems[0].prompt == GSM8K_ROWS[0]["question"]
    assert all(score(p, p.solution) for p in problems)
    assert score(problems[1], "#### 2400") and not score(problems[1], "#### 2401")
    assert not score(problems[0], "The answer is 72.")
    assert len(load_task(tmp_path / "gsm8k.jsonl", limit=1)) == 1


def test_math500_loader_and_scorer(tmp_path):
    problems = load_task(_write_jsonl(tmp_path / "math.jsonl", MATH_ROWS))
    assert [p.family for p in problems] == ["math500"] * 2 and problems[0].id == "test/prealgebra/1.json"
    assert problems[0].meta == {"subject": "Prealgebra", "level": 1}
    assert all(score(p, p.solution) for p in problems)
    assert score(problems[0], "First \\boxed{3}, no wait: the answer is $\\boxed{\\dfrac{1}{2}}$")
    assert score(problems[0], "\\boxed{0.5}") and not score(problems[0], "\\boxed{\\frac{1}{3}}")
    assert not score(problems[0], "The answer is \\frac{1}{2}.")  # it must be boxed
    assert score(problems[1], "\\boxed{90}") and not score(problems[1], "\\boxed{180^\\circ}")


def test_mbpp_loader_and_scorer(tmp_path):
    problems = load_task(_write_jsonl(tmp_path / "mbpp.jsonl", MBPP_ROWS))
    assert [p.family for p in problems] == ["mbpp", "mbpp"]
    assert [p.answer for p in problems] == ["similar_elements", "root"]
    assert "Your code should pass these tests" in problems[0].prompt and "assert root(16)" in problems[1].prompt
    assert all(score(p, p.solution) for p in problems)
    p = problems[1]
    assert score(p, "[BEGIN]\n```python\nimport math\n\ndef root(n):\n    return n ** 0.5\n```\n[DONE]")
    assert score(p, "def root(n):\n    return n ** 0.5\n[DONE]\nassert root(4) == 3")  # text after [DONE] ignored
    assert not score(p, "def root(n):\n    return n / 2\n")
    assert not score(p, "def root(n):\n    return 4\nimport sys\nsys.exit(0)\n")


def test_humaneval_loader_and_scorer_gz(tmp_path):
    path = _write_jsonl(tmp_path / "HumanEval.jsonl.gz", HUMANEVAL_ROWS, gz=True)
    (p,) = load_task(path)
    assert p.family == "humaneval" and p.id == "Toy/0" and p.answer == "add" and p.prompt == HUMANEVAL_ROWS[0]["prompt"]
    assert score(p, p.solution)
    assert not score(p, "    return [x + k + 1 for x in xs]\n")
    assert not score(p, "    return xs\n")
    assert score(p, "```python\ndef add(xs, k):\n    return [x + k for x in xs]\n```")


def test_registry_and_dispatch(tmp_path):
    assert set(TASKS) == {"arith", "pyfunc", "listops", *(f.name for f in SHORT_ANSWER_FAMILIES)}
    assert set(BENCHMARKS) == {"gsm8k", "math500", "mbpp", "humaneval", "plain-answer", "plain-code"}
    assert get_task("arith") is TASKS["arith"] and get_task("mbpp") is BENCHMARKS["mbpp"]
    with pytest.raises(KeyError):
        get_task("nope")
    assert len(load_task("arith", "dev", limit=7)) == 7 and len(load_task("listops")) == 200
    assert load_task("pyfunc", "test", 3, {"level": 2}) == TASKS["pyfunc"].generate("test", 3, {"level": 2})
    with pytest.raises(FileNotFoundError):
        load_task(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError):
        load_task(_write_jsonl(tmp_path / "odd.jsonl", [{"foo": 1}]))
    p = TASKS["arith"].generate("test", 1)[0]
    assert isinstance(p, Problem) and score(p, p.solution) and hash(p) == hash(p)


# ---------------------------------------------------------------- plain task files a user writes

def test_plain_answer_rows_score_by_number_exact_text_or_regex(tmp_path):
    rows = [{"prompt": "What is 2 + 3?", "answer": 5},
            {"prompt": "Capital of France?", "answer": "Paris"},
            {"prompt": "Greet me.", "answer": "^(hi|hello)\\b", "match": "regex"},
            {"prompt": "Year of the moon landing?", "answer": "1969", "match": "exact", "id": "moon"}]
    problems = load_task(_write_jsonl(tmp_path / "mine.jsonl", rows))
    assert [p.family for p in problems] == ["plain-answer"] * 4
    assert [p.id for p in problems] == ["mine-0", "mine-1", "mine-2", "moon"]  # the file's name, or the row's id
    number, exact, regex, exact_number = problems
    assert score(number, "2 + 3 = 5") and score(number, "#### 5.0\nmore text 7") and score(number, "It is 1,005 - 1000 = 5")
    assert not score(number, "2 + 3 = 6") and not score(number, "five") and not score(number, "#### 6\nso 5")
    assert score(exact, "The capital is:\nParis") and score(exact, "#### Paris")
    assert not score(exact, "paris") and not score(exact, "Paris, of course") and not score(exact, "")
    assert score(regex, "hello there") and score(regex, "Well.\nhi!") and not score(regex, "oh hi")
    assert score(exact_number, "1969") and not score(exact_number, "1969.0")  # exact, though it is a number
    assert all(p.solution == "" for p in problems)


def test_a_plain_rows_worked_solution_is_kept_and_never_scored(tmp_path):
    rows = [{"prompt": "What is 2 + 3?", "answer": 5, "solution": "2 + 3 = 5"},
            {"prompt": "What is 4 + 4?", "answer": 8, "solution": "4 + 4 = 9"}]  # a wrong worked reply
    right, wrong = load_task(_write_jsonl(tmp_path / "worked.jsonl", rows))
    assert right.solution == "2 + 3 = 5" and score(right, right.solution)
    assert wrong.solution == "4 + 4 = 9" and not score(wrong, wrong.solution)  # the answer decides, not the solution


def test_plain_code_rows_run_their_tests_in_the_sandbox(tmp_path):
    rows = [{"prompt": "Write add(a, b).", "tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]},
            {"prompt": "Write halve(x).", "tests": "assert abs(halve(3) - 1.5) < 1e-9", "entry_point": "halve"}]
    add, halve = load_task(_write_jsonl(tmp_path / "code.jsonl", rows))
    assert add.family == "plain-code" and add.answer == "add" and halve.answer == "halve"
    assert score(add, "```python\ndef add(a, b):\n    return a + b\n```")
    assert score(add, "def add(a, b):\n    return a + b\n")
    assert not score(add, "def add(a, b):\n    return a - b\n")
    assert score(halve, "def halve(x):\n    return x / 2\n") and not score(halve, "def halve(x):\n    return x // 2\n")


@pytest.mark.parametrize("lines, message", [
    (['{"prompt": "a", "answer": 1}', '{"prompt": "b"}'], r"bad.jsonl:2: no 'answer' in this row"),
    (['{"prompt": "a", "answer": 1}', '', '{"prompt": "b", "answer": 2'], r"bad.jsonl:3: not valid JSON"),
    (['{"prompt": "a", "answer": 1}', '[1, 2]'], r"bad.jsonl:2: a row must be a JSON object"),
    (['{"prompt": "a", "answer": 1}', '{"prompt": "", "answer": 2}'], r"bad.jsonl:2: 'prompt' must be"),
    (['{"prompt": "a", "answer": null}'], r"bad.jsonl:1: 'answer' must be"),
    (['{"prompt": "a", "answer": "x", "match": "fuzzy"}'], r"bad.jsonl:1: 'match' must be one of"),
    (['{"prompt": "a", "answer": "x", "match": "number"}'], r"bad.jsonl:1: 'match' is number"),
    (['{"prompt": "a", "answer": "(", "match": "regex"}'], r"bad.jsonl:1: 'answer' is not a valid regular"),
    (['{"prompt": "a", "tests": []}'], r"bad.jsonl:1: 'tests' must be"),
    (['{"prompt": "a", "answer": 1, "solution": 1}'], r"bad.jsonl:1: 'solution', when given, must be a string"),
    (['{"question": "a"}'], r"bad.jsonl:1: no task format has the fields"),
])
def test_malformed_rows_are_refused_with_file_and_line(tmp_path, lines, message):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=message):
        load_task(path)


def test_a_files_splits_are_disjoint_and_cover_it(tmp_path):
    rows = [{"prompt": f"What is {i} + 1?", "answer": i + 1} for i in range(300)]
    path = _write_jsonl(tmp_path / "many.jsonl", rows)
    every = load_task(path)
    splits = {s: load_task(path, s) for s in ("train", "dev", "test")}
    assert len(every) == 300 and sum(map(len, splits.values())) == 300
    ids = [{p.id for p in ps} for ps in splits.values()]
    assert not (ids[0] & ids[1]) and not (ids[0] & ids[2]) and not (ids[1] & ids[2])
    assert 150 < len(splits["train"]) < 250 and len(splits["dev"]) > 10 and len(splits["test"]) > 30
    assert load_task(path, "train", limit=5) == splits["train"][:5]
