"""Escape attempts against the code sandbox: all blocked by the operating-system isolation.

Most attempts run with the in-process audit hook left out (`audit_hook=False`), as if the program
had switched it off (it can: its state is reachable from inside), so they test the boundary that
is relied on: namespaces, a private filesystem view, dropped privileges and limits it cannot raise.
Each test checks the effect from outside, on this machine."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from cospec_local.tasks import sandbox
from cospec_local.tasks.sandbox import SandboxUnavailableError, run_python
from cospec_local.tasks.code import run_tests

pytestmark = pytest.mark.skipif(not sandbox.isolation_available(), reason="needs bubblewrap and namespaces")


def escape(code: str, **kw):
    return run_python(code, audit_hook=False, timeout=kw.pop("timeout", 5.0), **kw)


def test_files_outside_cannot_be_written_deleted_or_changed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    victim.chmod(0o644)
    target = tmp_path / "pwned.txt"
    r = escape(f"""
import os, shutil, subprocess
attempts = []
def attempt(name, f):
    try:
        f(); attempts.append(name + ': done')
    except Exception as e:
        attempts.append(name + ': ' + type(e).__name__)
attempt('open', lambda: open({str(target)!r}, 'w').write('x'))
attempt('remove', lambda: os.remove({str(victim)!r}))
attempt('dir_fd', lambda: os.unlink('victim.txt', dir_fd=os.open({str(tmp_path)!r}, os.O_RDONLY)))
attempt('rename', lambda: os.rename({str(victim)!r}, {str(target)!r}))
attempt('chmod', lambda: os.chmod({str(victim)!r}, 0o777))
attempt('shell', lambda: subprocess.run(['sh', '-c', 'echo x > {target} ; rm -f {victim}'], check=True))
attempt('rmtree', lambda: shutil.rmtree({str(tmp_path)!r}))
print(attempts)
""")
    assert victim.read_text() == "keep me" and (victim.stat().st_mode & 0o777) == 0o644
    assert not target.exists()
    assert r.isolated


def test_secrets_of_this_machine_are_not_readable(monkeypatch):
    monkeypatch.setenv("COSPEC_TEST_SECRET", "s3cr3t-value")
    r = escape("""
import os, glob
out = [sorted(os.environ.items())]
for p in ['/etc/shadow', '/etc/passwd', '/root/.bashrc', '/root/.ssh', '/proc/1/environ', '/home']:
    try:
        out.append((p, open(p).read()[:200] if os.path.isfile(p) else os.listdir(p)))
    except Exception as e:
        out.append((p, type(e).__name__))
for pid in (os.listdir('/proc') if os.path.isdir('/proc') else []):  # no /proc at all, today
    if pid.isdigit():
        try:
            out.append((pid, open(f'/proc/{pid}/environ', 'rb').read()[:500]))
        except Exception as e:
            out.append((pid, type(e).__name__))
print(out)
""")
    assert "s3cr3t-value" not in r.stdout and "root:" not in r.stdout
    assert r.passed, r.stderr


def test_no_network_not_even_loopback():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    r = escape(f"""
import socket
s = socket.socket()
s.settimeout(2)
try:
    s.connect(('127.0.0.1', {port}))
    s.sendall(b'hello from the sandbox')
    print('connected')
except OSError as e:
    print('refused', e)
""")
    try:
        conn, _ = server.accept()
        conn.close()
        accepted = True
    except OSError:
        accepted = False
    server.close()
    assert not accepted and "connected" not in r.stdout


def test_processes_outside_cannot_be_signalled():
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        r = escape(f"""
import os, signal
hits = 0
for pid in list(range(1, 4096)) + [{victim.pid}]:
    try:
        os.kill(pid, signal.SIGKILL); hits += 1
    except OSError:
        pass
try:
    fd = os.pidfd_open({victim.pid})
    signal.pidfd_send_signal(fd, signal.SIGKILL)
except OSError as e:
    print('pidfd', type(e).__name__)
print('signalled', hits)
""")
        time.sleep(0.5)
        assert victim.poll() is None, "a process outside the sandbox was killed"
        assert r.returncode != 0 or "signalled" in r.stdout
    finally:
        victim.kill()
        victim.wait()


@pytest.mark.slow
def test_a_detached_child_does_not_outlive_the_run():
    marker = f"cospec-escape-marker-{os.getpid()}"
    r = escape(f"""
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv('/bin/sh', ['sh', '-c', 'exec -a {marker} sleep 300'])
    os._exit(0)
time.sleep(60)
""", timeout=1.0)
    assert r.timed_out
    time.sleep(0.5)
    found = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    assert found.stdout.strip() == "", f"left running: {found.stdout}"


def test_limits_cannot_be_raised_and_the_disk_cannot_be_filled():
    r = escape("""
import resource
try:
    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    print('raised')
except (ValueError, OSError) as e:
    print('refused', type(e).__name__)
n = 0
try:
    while True:
        with open(f'f{n}', 'wb') as f:
            f.write(b'x' * (1 << 19))
        n += 1
except OSError as e:
    print('stopped', n, e.errno)
""", timeout=20)
    assert "refused" in r.stdout and "raised" not in r.stdout
    stopped = [line for line in r.stdout.splitlines() if line.startswith("stopped")]
    assert stopped and int(stopped[0].split()[1]) < 200  # its private 64 MiB space, not this disk


def test_a_forged_exit_code_or_forged_results_do_not_pass_a_task():
    tests = "assert double(2) == 4\nassert double(5) == 10\nassert double(-1) == -2"
    right = run_tests("def double(x):\n    return 2 * x\n", tests)
    assert right.passed
    forgeries = [
        "def double(x):\n    return x\nimport os\nos._exit(86)\n",
        "def double(x):\n    return x\nraise SystemExit(86)\n",
        "import os, json\nos.write(int(os.environ['COSPEC_RESULTS_FD']), json.dumps([['ok', 'True']] * 3).encode())\n"
        "def double(x):\n    raise SystemExit(86)\n",
        "import sys\nsys.stdout.write('PASS')\ndef double(x):\n    return 1\n",
        "class Anything:\n    def __eq__(self, other):\n        return True\n    def __repr__(self):\n        return '4'\n"
        "def double(x):\n    return Anything()\n",
    ]
    for program in forgeries:
        assert not run_tests(program, tests).passed, program


def test_refuses_to_run_without_isolation_unless_allowed(monkeypatch):
    monkeypatch.setattr(sandbox, "_bwrap", lambda: None)
    monkeypatch.delenv(sandbox.UNSAFE_ENV, raising=False)
    with pytest.raises(SandboxUnavailableError, match="bubblewrap"):
        run_python("print(1)")
    r = run_python("print(1)", allow_unisolated=True)
    assert r.passed and not r.isolated and r.stdout == "1\n"
    monkeypatch.setenv(sandbox.UNSAFE_ENV, "1")
    assert run_python("print(2)").stdout == "2\n"


def test_humaneval_checks_are_decided_outside_too():
    from cospec_local.tasks.code import value_checks

    tests = ('METADATA = {"author": "x"}\n\ndef check(candidate):\n    """Checks."""\n'
             '    assert candidate([1, 2], 1) == [2, 3]\n    assert candidate([], 5) == []\n\ncheck(add)')
    assert value_checks(tests) == [("add([1, 2], 1)", [2, 3]), ("add([], 5)", [])]
    assert value_checks("def check(candidate):\n    assert abs(candidate(1) - 2) < 1e-6\n\ncheck(f)") is None
    assert run_tests("def add(xs, k):\n    return [x + k for x in xs]\n", tests).passed
    assert not run_tests("def add(xs, k):\n    return xs\nimport os\nos._exit(86)\n", tests).passed
    assert not run_tests("def add(xs, k):\n    return xs\nraise SystemExit(86)\n", tests).passed


TOLERANCE_TESTS = "assert abs(half(3) - 1.5) < 1e-9\nassert abs(half(-1) + 0.5) < 1e-9\n"  # not `CALL == LITERAL`


@pytest.mark.parametrize("label, program", [
    ("exit with the pass code", "def half(x):\n    return x\nimport os\nos._exit(86)\n"),
    ("exit inside the tested call", "def half(x):\n    import os\n    os._exit(86)\n"),
    ("SystemExit with the pass code", "def half(x):\n    raise SystemExit(86)\n"),
    ("stdout and stderr reopened onto its own files, then the pass code",
     "import os\ndef half(x):\n    return 0\nos.close(1)\nos.close(2)\nopen('/work/out', 'w')\nopen('/work/err', 'w')\n"
     "os._exit(86)\n"),
    ("printed output rewritten with lseek and ftruncate",
     "import os\nprint('FAILED', flush=True)\nos.lseek(1, 0, os.SEEK_SET)\nos.ftruncate(1, 0)\nprint('PASSED')\n"
     "def half(x):\n    return 1\n"),
    ("answers written ahead of the calls", "import os\nos.write(int(os.environ['COSPEC_RESULTS_FD']), "
     "b'[\"ok\", \"1.5\"]\\n' * 8)\ndef half(x):\n    return 0\n"),
    ("an object equal to anything", "class Any:\n    def __sub__(self, o): return 0\n    def __add__(self, o): return 0\n"
     "    def __abs__(self): return 0\n    def __lt__(self, o): return True\n    def __repr__(self): return '0'\n"
     "def half(x):\n    return Any()\n"),
    ("the guard rail switched off, then the pass code",
     "import sys, os\nsys.addaudithook = None\ndef half(x):\n    return x\nos._exit(86)\n"),
])
def test_a_verdict_the_candidate_cannot_forge(label, program):
    """Tests that are not `CALL == LITERAL` run in a process of their own; nothing the candidate
    does to its own process (exit codes, its output, the results channel) passes them."""
    assert run_tests("def half(x):\n    return x / 2\n", TOLERANCE_TESTS).passed  # the same tests can pass
    r = run_tests(program, TOLERANCE_TESTS)
    assert not r.passed, label


def test_humaneval_style_tolerance_checks_pass_right_answers_through_the_split_run():
    tests = ("import math\n\ndef check(candidate):\n    assert math.isclose(candidate([1.0, 2.0]), 1.5)\n"
             "    assert abs(candidate([3.0]) - 3.0) < 1e-6\n    try:\n        candidate([])\n    except ValueError:\n"
             "        pass\n    else:\n        assert False\n\ncheck(mean)\n")
    right = "def mean(xs):\n    if not xs:\n        raise ValueError('empty')\n    return sum(xs) / len(xs)\n"
    assert run_tests(right, tests).passed
    assert not run_tests(right.replace("raise ValueError('empty')", "return 0.0"), tests).passed
    assert not run_tests("def mean(xs):\n    return float('inf')\n", tests).passed


def test_no_other_process_is_visible_not_even_the_one_above(monkeypatch):
    """No /proc inside: /proc/<ppid>/environ (bubblewrap's, which holds what this process passed
    it) cannot be read, and neither can any process list."""
    r = escape("import os\nfor path in ('/proc/1/environ', f'/proc/{os.getppid()}/environ', '/proc/self/environ'):\n"
               "    try:\n        print(path, open(path, 'rb').read())\n    except OSError as e:\n"
               "        print(path, type(e).__name__)\nprint('proc' in os.listdir('/'))\n")
    assert r.passed, r.stderr
    assert r.stdout.count("FileNotFoundError") == 3 and r.stdout.strip().endswith("False")
