"""Turning a model's completion into a program, and checking it with tests in the sandbox.

Convention (shared by pyfunc, HumanEval and MBPP):
- If the completion holds a fenced code block (```python, ```py or bare ```), that block is the
  code: the first block defining the entry point, else the first block. A block that defines the
  entry point is placed after the prefix (the prompt, for function-completion tasks; it overrides
  the prompt's stub, while the prompt's imports stay). A block without it is a function body.
- Otherwise the completion continues the prefix verbatim (completion mode: the model writes the
  function body after the prompt's signature and docstring), cut at the first ```. A bare ``` after
  code with no partner fence counts as closing that code, not as opening a block.
The program then runs with __name__ != "__main__", followed by the tests, and passes only when
it reaches the final `raise SystemExit(PASS_CODE)` after all tests.
"""
from __future__ import annotations

import re
import textwrap

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


def run_tests(program: str, tests: str, timeout: float = 5.0, memory_mb: int = 256) -> SandboxResult:
    source = f"{program}\n\n{tests}\n\nraise SystemExit({PASS_CODE})\n"
    return run_python(source, timeout=timeout, memory_mb=memory_mb, pass_code=PASS_CODE, run_name="__candidate__")
