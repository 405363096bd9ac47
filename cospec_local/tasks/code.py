"""Turning a model's completion into a program, and checking it with tests in the sandbox.

Convention (shared by pyfunc, HumanEval and MBPP):
- If the completion holds a fenced code block (```python, ```py or bare ```), that block is the
  code: the first block defining the entry point, else the first block. A block that defines the
  entry point is placed after the prefix (the prompt, for function-completion tasks; it overrides
  the prompt's stub, while the prompt's imports stay). A block without it is a function body.
- Otherwise the completion continues the prefix verbatim (completion mode: the model writes the
  function body after the prompt's signature and docstring), cut at the first ```. A bare ``` after
  code with no partner fence counts as closing that code, not as opening a block.
The program then runs with __name__ != "__main__" in the sandbox. Tests of the form
`assert CALL == LITERAL` (pyfunc, most of MBPP, and HumanEval's check functions made only of
those) are decided outside the child: the child only
evaluates each CALL and hands repr() of its value back through a pipe; this process compares those
values with the LITERALs, which the child never sees, so no trick inside the child (a forged exit
code, rewritten output, a disabled guard) can turn a wrong answer into a pass. Other tests (e.g.
`assert abs(f(x) - y) < 1e-6`) run as written and pass when the program reaches the final
`raise SystemExit(PASS_CODE)`: that verdict comes from inside the child.
"""
from __future__ import annotations

import ast
import json
import re
import textwrap
from dataclasses import replace

from ..sandbox import SandboxResult, run_python

PASS_CODE = 86  # not 0, so that a stray sys.exit(0) in generated code cannot pass
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.S | re.I)


def _closes_code(completion: str) -> bool:
    """True when the first fence ends code written before it (completion mode followed by ```):
    it is bare, text precedes it, and the fences cannot all pair up."""
    first = completion.find("```")
    return (bool(completion[:first].strip()) and completion.count("```") % 2 == 1
            and not re.match(r"```[ \t]*(?:python3?|py)\b", completion[first:], re.I))


def build_program(completion: str, prefix: str = "", entry_point: str | None = None) -> str:
    blocks = [] if _closes_code(completion) else [b for b in _FENCE.findall(completion) if b.strip()]
    if not blocks:
        return prefix + completion.split("```")[0]
    defines = re.compile(rf"^[ \t]*(?:async[ \t]+)?def[ \t]+{re.escape(entry_point)}[ \t]*\(", re.M) \
        if entry_point else None
    code = next((b for b in blocks if defines and defines.search(b)), blocks[0])
    if not prefix or (defines and defines.search(code)):
        return prefix + ("\n" if prefix else "") + code
    first = next(line for line in code.splitlines() if line.strip())
    return prefix + (code if first[:1].isspace() else textwrap.indent(code, "    "))


def value_checks(tests: str) -> list[tuple[str, object]] | None:
    """(source of CALL, LITERAL) for tests that are all `assert CALL == LITERAL`, written either at
    the top level (pyfunc, MBPP) or in HumanEval's `def check(candidate): ...` followed by
    `check(entry_point)` (with literal assignments such as METADATA beside it); None otherwise."""
    try:
        tree = ast.parse(tests)
    except SyntaxError:
        return None
    body = tree.body
    checker = [n for n in body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if checker:
        call = body[-1]
        if not (len(checker) == 1 and isinstance(call, ast.Expr) and isinstance(call.value, ast.Call)
                and isinstance(call.value.func, ast.Name) and call.value.func.id == "check"
                and len(call.value.args) == 1 and isinstance(call.value.args[0], ast.Name)
                and len(checker[0].args.args) == 1):
            return None
        for node in body[:-1]:
            if node is not checker[0] and not (isinstance(node, ast.Assign) and _is_literal(node.value)):
                return None
        param, entry = checker[0].args.args[0].arg, call.value.args[0].id
        statements = [n for n in checker[0].body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
        renamed = [_Rename(param, entry).visit(n) for n in statements]
        return _assert_checks(renamed)
    return _assert_checks(body)


def _is_literal(node: ast.AST) -> bool:
    try:
        ast.literal_eval(node)
        return True
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False


class _Rename(ast.NodeTransformer):
    def __init__(self, old: str, new: str):
        self.old, self.new = old, new

    def visit_Name(self, node: ast.Name) -> ast.Name:
        return ast.copy_location(ast.Name(self.new, node.ctx), node) if node.id == self.old else node


def _assert_checks(statements: list[ast.AST]) -> list[tuple[str, object]] | None:
    checks = []
    for node in statements:
        test = node.test if isinstance(node, ast.Assert) else None
        if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
            return None
        try:
            checks.append((ast.unparse(test.left), ast.literal_eval(test.comparators[0])))
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None
    return checks or None


def _probe_program(program: str, calls: list[str]) -> str:
    """The program, then each call evaluated on its own (anything it raises, SystemExit too, is
    recorded as an error), the reprs written as JSON to the sandbox's results descriptor."""
    probes = ",\n    ".join(f"__cospec_probe(lambda: {call})" for call in calls)
    return (f"{program}\n\n"
            "def __cospec_probe(f):\n"
            "    try:\n"
            "        return ['ok', repr(f())]\n"
            "    except BaseException as e:\n"
            "        return ['error', type(e).__name__]\n\n"
            f"__cospec_results = [\n    {probes},\n]\n"
            "import json as __cospec_json, os as __cospec_os\n"
            "__cospec_os.write(int(__cospec_os.environ['COSPEC_RESULTS_FD']), "
            "__cospec_json.dumps(__cospec_results).encode())\n")


def _values_match(results_json: bytes | None, expected: list) -> bool:
    try:
        results = json.loads(results_json or b"")
    except ValueError:
        return False
    if not isinstance(results, list) or len(results) != len(expected):
        return False
    for result, want in zip(results, expected):
        if not (isinstance(result, list) and len(result) == 2 and result[0] == "ok" and isinstance(result[1], str)):
            return False
        try:
            if ast.literal_eval(result[1]) != want:
                return False
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return False
    return True


def run_tests(program: str, tests: str, timeout: float = 5.0, memory_mb: int = 256) -> SandboxResult:
    checks = value_checks(tests)
    if checks is None:
        source = f"{program}\n\n{tests}\n\nraise SystemExit({PASS_CODE})\n"
        return run_python(source, timeout=timeout, memory_mb=memory_mb, pass_code=PASS_CODE, run_name="__candidate__")
    r = run_python(_probe_program(program, [call for call, _ in checks]), timeout=timeout, memory_mb=memory_mb,
                   run_name="__candidate__")
    passed = not r.timed_out and _values_match(r.results, [want for _, want in checks])
    return replace(r, passed=passed)
