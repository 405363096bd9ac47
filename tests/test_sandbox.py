"""The sandbox that runs generated code: limits, timeouts and isolation."""
from __future__ import annotations

import io
import resource
import time
import tokenize
from pathlib import Path

import pytest

import cospec_local.tasks.sandbox as sandbox_module
from cospec_local.tasks.sandbox import run_python

MARGIN = 3.0  # seconds allowed beyond the timeout on a loaded machine


def test_passing_program_passes_and_returns_output():
    r = run_python("import math\nprint(math.factorial(5))\n")
    assert r.passed and r.returncode == 0 and not r.timed_out and r.killed_reason is None
    assert r.stdout == "120\n"


def test_failing_assert_fails_with_traceback():
    r = run_python("assert 1 + 1 == 3, 'bad sum'\n")
    assert not r.passed and r.returncode == 1
    assert "AssertionError: bad sum" in r.stderr


@pytest.mark.slow
def test_infinite_loop_is_killed_within_timeout():
    start = time.monotonic()
    r = run_python("while True:\n    pass\n", timeout=1.0)
    assert time.monotonic() - start < 1.0 + MARGIN
    assert r.timed_out and not r.passed and r.killed_reason == "timeout"


def test_a_program_killed_by_a_signal_is_reported_by_it():
    """Isolated, bubblewrap turns the program's death by signal N into exit status 128 + N."""
    r = run_python("import signal\nsignal.raise_signal(signal.SIGXCPU)\n", timeout=5.0)
    assert not r.passed and not r.timed_out and r.killed_reason == "cpu limit", r
    r = run_python("import signal\nsignal.raise_signal(signal.SIGKILL)\n", timeout=5.0)
    assert not r.passed and not r.timed_out and r.killed_reason == "signal SIGKILL", r


@pytest.mark.slow
def test_sleeping_program_is_killed_within_timeout():
    start = time.monotonic()
    r = run_python("import time\ntime.sleep(60)\n", timeout=1.0)
    assert time.monotonic() - start < 1.0 + MARGIN
    assert r.timed_out and not r.passed


def test_memory_bombs_fail_without_hurting_this_process():
    limit_before = resource.getrlimit(resource.RLIMIT_AS)
    huge = run_python("x = bytearray(10**10)\n", memory_mb=256)
    growing = run_python("xs = []\nwhile True:\n    xs.append([0] * 100000)\n", memory_mb=256, timeout=20)
    for r in (huge, growing):
        assert not r.passed and not r.timed_out
        assert r.killed_reason == "memory limit", r.stderr[-500:]
    assert resource.getrlimit(resource.RLIMIT_AS) == limit_before
    assert len(bytearray(300 << 20)) == 300 << 20  # this process may still allocate more than the child could


def test_output_flood_is_capped():
    r = run_python("while True:\n    print('x' * 1000)\n", timeout=10, max_output=4096)
    assert not r.passed and not r.timed_out  # stopped by the file size limit, long before the timeout
    assert len(r.stdout) < 4096 + 200 and "bytes cut" in r.stdout
    assert r.killed_reason == "file size limit"


def test_huge_file_write_is_stopped():
    r = run_python("with open('big.bin', 'wb') as f:\n    f.write(b'x' * 10**8)\n")
    assert not r.passed and r.killed_reason == "file size limit"


def test_process_creation_is_refused():
    for code in ("import os\nos.fork()\n", "import subprocess\nsubprocess.run(['true'])\n",
                 "import os\nos.system('true')\n", "import ctypes\n"):
        r = run_python(code)
        assert not r.passed and r.killed_reason and r.killed_reason.startswith("blocked"), (code, r.stderr)


def test_writes_outside_the_temporary_directory_are_refused(tmp_path):
    target = tmp_path / "outside.txt"
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    r = run_python(f"open({str(target)!r}, 'w').write('x')\n")
    assert not r.passed and not target.exists()
    r = run_python(f"import os\nos.remove({str(victim)!r})\n")
    assert not r.passed and victim.read_text() == "keep me"
    # inside its own directory a program may write, read and use tempfile
    r = run_python("import tempfile\nopen('a.txt', 'w').write('ok')\ntempfile.mkstemp()\nprint(open('a.txt').read())\n")
    assert r.passed and r.stdout == "ok\n"


def test_own_directory_and_minimal_environment():
    r = run_python("import os\nprint(os.getcwd())\nprint(' '.join(sorted(os.environ)))\n")
    cwd, env = r.stdout.splitlines()
    assert r.passed and r.isolated and cwd == "/work"
    assert set(env.split()) <= {"PATH", "LANG", "HOME", "PWD", "LC_CTYPE", "COSPEC_RESULTS_FD"}


def test_site_packages_are_not_importable_but_stdlib_is():
    assert not run_python("import numpy\n").passed  # installed in the venv, invisible with -I -S
    assert run_python("import json, re, collections, fractions, itertools, heapq, tempfile\n").passed


def test_stdin_is_empty():
    r = run_python("input()\n", timeout=5)
    assert not r.passed and not r.timed_out and "EOFError" in r.stderr


def test_pass_code_and_run_name():
    assert run_python("raise SystemExit(86)\n", pass_code=86).passed
    assert not run_python("import sys\nsys.exit(0)\n", pass_code=86).passed
    r = run_python("print(__name__)\nif __name__ == '__main__':\n    raise SystemExit(1)\n", run_name="__candidate__")
    assert r.passed and r.stdout == "__candidate__\n"


def _calls(path: Path, names: set[str]) -> list[str]:
    toks = [t for t in tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
            if t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT)]
    return [f"{path.name}:{a.start[0]}" for prev, a, b in zip(toks, toks[1:], toks[2:])
            if a.type == tokenize.NAME and a.string in names and b.string == "(" and prev.string != "."]


def test_no_exec_or_eval_in_process():
    files = sorted(Path(sandbox_module.__file__).parent.glob("*.py"))  # the tasks package, sandbox.py included
    assert len(files) >= 7
    assert [c for f in files for c in _calls(f, {"exec", "eval", "compile", "__import__"})] == []
