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
`assert abs(f(x) - y) < 1e-6`) run as written in a second isolated process that holds no code of
the completion's: its calls to the completion's functions go, as values, to the completion's own
process and back (split_programs, sandbox.run_split); the test passes when that second process
reaches its final `raise SystemExit(PASS_CODE)`.
"""
from __future__ import annotations

import ast
import json
import re
import textwrap
from dataclasses import replace

from .sandbox import SandboxResult, run_python, run_split

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


# Values cross between the two processes of a split run as Python literals (repr, then
# literal_eval), with inf and nan spelled as repr spells them; both programs carry this decoder.
_DECODER = """
import ast as _cospec_ast
def _cospec_decode(text):
    tree = _cospec_ast.parse(text, mode="eval")
    class _Floats(_cospec_ast.NodeTransformer):
        def visit_Name(self, node):
            if node.id in ("inf", "nan"):
                return _cospec_ast.copy_location(_cospec_ast.Constant(float(node.id)), node)
            return node
    return _cospec_ast.literal_eval(_Floats().visit(tree).body)
"""

_SERVE = """
def _cospec_serve():
    import json as _j, os as _o
    _in = _o.fdopen(int(_o.environ["COSPEC_REQUESTS_FD"]), "rb")
    _out = _o.fdopen(int(_o.environ["COSPEC_RESULTS_FD"]), "wb")
    _names = globals()
    for _line in _in:
        try:
            _name, _args, _kwargs = _j.loads(_line)
            _reply = ["ok", repr(_names[_name](*_cospec_decode(_args), **_cospec_decode(_kwargs)))]
        except BaseException as _e:
            _reply = ["error", type(_e).__name__]
        _out.write((_j.dumps(_reply) + "\\n").encode())
        _out.flush()
_cospec_serve()
"""

_CALLER = """
import builtins as _cospec_builtins, json as _cospec_json, os as _cospec_os
_cospec_in = _cospec_os.fdopen(int(_cospec_os.environ["COSPEC_REQUESTS_FD"]), "rb")
_cospec_out = _cospec_os.fdopen(int(_cospec_os.environ["COSPEC_RESULTS_FD"]), "wb")

class _CospecCandidate:
    \"\"\"A function of the candidate's, called in the candidate's process with these values.\"\"\"
    def __init__(self, name):
        self.__name__ = name
    def __call__(self, *args, **kwargs):
        _cospec_out.write((_cospec_json.dumps([self.__name__, repr(args), repr(kwargs)]) + "\\n").encode())
        _cospec_out.flush()
        line = _cospec_in.readline()
        if not line:
            raise RuntimeError("the candidate's process ended")
        status, value = _cospec_json.loads(line)
        if status == "ok":
            return _cospec_decode(value)
        error = getattr(_cospec_builtins, value, None)
        raise (error if isinstance(error, type) and issubclass(error, Exception) else RuntimeError)(value)
"""


def _top_level_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return names


def split_programs(program: str, tests: str) -> tuple[str, str]:
    """(candidate, checker) for run_split: the candidate's program followed by a loop that answers
    calls; the tests, preceded by the program's imports and by stand-ins for the names the tests
    use that the program defines, which call into the candidate's process. Arguments and results
    travel as literals, so a result that is not one (an object, a generator) fails the test."""
    try:
        tree = ast.parse(program)
        defined = _top_level_names(tree)
        imports = [ast.unparse(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))
                   and not (isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names))]
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        defined, imports = set(), []  # the candidate fails as it starts; its names stay undefined
    test_tree = ast.parse(tests)
    used = {n.id for n in ast.walk(test_tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    stand_ins = sorted((used & defined) - _top_level_names(test_tree))
    candidate = f"{program}\n\n{_DECODER}\n{_SERVE}"
    checker = "\n".join([_DECODER, _CALLER, *imports, *(f"{name} = _CospecCandidate({name!r})" for name in stand_ins),
                         "", tests, "", f"raise SystemExit({PASS_CODE})", ""])
    return candidate, checker


def run_tests(program: str, tests: str, timeout: float = 5.0, memory_mb: int = 256) -> SandboxResult:
    """Run the tests against the program. The verdict never comes from a process that ran the
    program: `assert CALL == LITERAL` tests compare, here, the values the calls return with
    literals the program never sees; other tests run in a process of their own that reaches the
    program's functions only through values (sandbox.run_split)."""
    checks = value_checks(tests)
    if checks is None:
        try:
            candidate, checker = split_programs(program, tests)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:  # the tests themselves do not parse
            return SandboxResult(False, 1, "", f"the tests do not parse: {exc}", False, "tests do not parse")
        return run_split(candidate, checker, timeout=timeout, memory_mb=memory_mb, pass_code=PASS_CODE)
    r = run_python(_probe_program(program, [call for call, _ in checks]), timeout=timeout, memory_mb=memory_mb,
                   run_name="__candidate__")
    passed = not r.timed_out and _values_match(r.results, [want for _, want in checks])
    return replace(r, passed=passed)
