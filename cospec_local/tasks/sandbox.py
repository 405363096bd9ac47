"""Run untrusted Python (model-written code, benchmark tests) in an isolated child process.

Nothing here ever exec()s or eval()s the code in this process. `run_python` writes the code to a
fresh temporary directory and runs it with `python -I -S` (isolated mode, no site-packages, so only
the standard library is importable) inside bubblewrap (Debian's `bubblewrap` package):

- new user, PID, network, IPC, UTS and cgroup namespaces: the program runs as nobody (65534), sees
  only its own processes, has no network (not even loopback), and dies with its parent;
- a private filesystem view: /usr and the Python runtime read-only, its own directory as /work
  (read-write), a private /tmp, a minimal /dev; no /proc (even its own namespace's would show
  bubblewrap, the process above it, and its environment), no /etc, no /root, no home directory,
  no other file of this machine;
- an environment of PATH, LANG and HOME only; all capabilities dropped; a session of its own;
- limits it sets on itself, hard, before the program starts (so the program cannot raise them):
  RLIMIT_AS (memory), RLIMIT_CPU, RLIMIT_FSIZE (largest file, stdout/stderr included),
  RLIMIT_NOFILE, RLIMIT_CORE=0; a wall-clock timeout kills the whole namespace;
- stdout/stderr go to files bounded by RLIMIT_FSIZE and come back capped to `max_output` bytes.

A startup audit hook still refuses process creation, ctypes, sockets and writes outside /work: a
guard rail against mistakes in generated code. The isolation above is the boundary; the hook can be
switched off from inside and is not relied on.

Where bubblewrap or namespaces are missing, generated code is not run at all, unless the caller
explicitly allows the unisolated fallback (`allow_unisolated=True`, the CLI's
`--unsafe-code-execution`, or COSPEC_UNSAFE_CODE_EXECUTION=1): then only the limits and the hook
apply, which code written to escape walks through.

A test's verdict never comes from a process that ran generated code: tasks/code.py either compares
the values the tested calls return with expectations the child never sees, or runs the tests in a
second isolated process that reaches the candidate's functions only through values relayed by
this one (run_split); the candidate cannot write, end early or forge that process's exit status.
"""
from __future__ import annotations

import functools
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

UNSAFE_ENV = "COSPEC_UNSAFE_CODE_EXECUTION"
WORK = "/work"  # the program's writable directory inside the isolation (a tmpfs)
SRC = "/src"    # the program itself, read-only


class SandboxUnavailableError(RuntimeError):
    """Generated code would run without OS-level isolation, and the caller did not allow it."""

# Runs inside the child before the program. argv: main.py, run_name, root directory, limits.
_BOOT = r'''
import os, sys, runpy, resource
sys.dont_write_bytecode = True
_path, _run_name, _root = sys.argv[1:4]
_mem, _cpu, _fsize = (int(x) for x in sys.argv[4:7])
os.environ["COSPEC_RESULTS_FD"] = sys.argv[7]  # where tasks/code.py's probes write the values they return
if sys.argv[8] != "-1":
    os.environ["COSPEC_REQUESTS_FD"] = sys.argv[8]  # what run_split's other process sends
for _r, _v in ((resource.RLIMIT_AS, _mem), (resource.RLIMIT_CPU, _cpu), (resource.RLIMIT_FSIZE, _fsize),
               (resource.RLIMIT_NOFILE, 64), (resource.RLIMIT_CORE, 0)):
    resource.setrlimit(_r, (_v, _v))  # hard limits: the program cannot raise them again
del _r, _v, _mem, _cpu, _fsize
_BLOCKED = {"os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
            "subprocess.Popen", "os.kill", "os.killpg", "signal.pthread_kill", "ctypes.dlopen",
            "socket.__new__", "resource.setrlimit", "resource.prlimit", "os.setuid", "os.setgid"}
_NO_IMPORT = {"_posixsubprocess", "_ctypes"}  # fork_exec and ctypes calls are not audited
_PATH_ARGS = {"os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.chmod": (0,),
              "os.chown": (0,), "os.truncate": (0,), "os.utime": (0,), "shutil.rmtree": (0,),
              "os.rename": (0, 1), "os.link": (0, 1), "os.symlink": (1,)}
_WRITE = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_created = [0]

def _inside(p):
    if isinstance(p, int):  # an already open descriptor
        return True
    p = os.path.realpath(os.fsdecode(p))
    return p == _root or p.startswith(_root + os.sep) or p == os.devnull

def _hook(event, args):
    bad = event in _BLOCKED or (event == "import" and args[0] in _NO_IMPORT)
    if event == "open" and args[2] & _WRITE:
        bad = not _inside(args[0])
        _created[0] += bool(args[2] & os.O_CREAT)
        bad = bad or _created[0] > 200  # RLIMIT_FSIZE is per file: bound the count too
    elif event in _PATH_ARGS:
        bad = not all(_inside(args[i]) for i in _PATH_ARGS[event])
    if bad:
        raise PermissionError(f"sandbox: {event} {args[0] if args else ''} is not allowed")

sys.addaudithook(_hook)
sys.argv = [_path]
runpy.run_path(_path, run_name=_run_name)
'''


@dataclass(frozen=True)
class SandboxResult:
    passed: bool  # finished in time with returncode == pass_code
    returncode: int  # negative: killed by that signal (SIGKILL after a timeout)
    stdout: str
    stderr: str
    timed_out: bool
    killed_reason: str | None  # "timeout", "memory limit", "cpu limit", "file size limit", "blocked: ...", ...
    elapsed: float = 0.0
    results: bytes | None = b""  # what it wrote to its results descriptor (None: more than allowed)
    isolated: bool = True


@functools.lru_cache(maxsize=1)
def _bwrap() -> str | None:
    """bubblewrap's path, if it can create the namespaces here (probed once)."""
    path = shutil.which("bwrap")
    if path is None:
        return None
    probe = subprocess.run([path, *_isolation_args(tempfile.gettempdir()), "/bin/true"], capture_output=True,
                           timeout=30, stdin=subprocess.DEVNULL)
    return path if probe.returncode == 0 else None


def isolation_available() -> bool:
    return _bwrap() is not None


WORK_BYTES = 64 << 20  # the program's writable space, a tmpfs: nothing it writes reaches this machine's disk


def _isolation_args(root: str) -> list[str]:
    args = ["--unshare-all", "--die-with-parent", "--new-session", "--clearenv",
            "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "LANG", "C.UTF-8", "--setenv", "HOME", WORK,
            "--uid", "65534", "--gid", "65534", "--cap-drop", "ALL",
            "--ro-bind", "/usr", "/usr", "--dev", "/dev", "--tmpfs", "/tmp"]
    for top in ("/bin", "/lib", "/lib32", "/lib64", "/sbin"):  # merged-/usr links, or real folders
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    runtime = os.path.realpath(sys.base_prefix)
    if not runtime.startswith("/usr/"):
        args += ["--ro-bind", runtime, runtime]
    return args + ["--ro-bind", root, SRC, "--size", str(WORK_BYTES), "--tmpfs", WORK, "--chdir", WORK]


def _allowed_unisolated(allow: bool | None) -> bool:
    return bool(allow) or os.environ.get(UNSAFE_ENV, "") not in ("", "0")


def _read_capped(f, cap: int) -> str:
    size = f.seek(0, os.SEEK_END)
    f.seek(0)
    if size <= cap:
        data = f.read()
    else:  # keep head and tail: the tail holds the traceback
        head = f.read(cap // 2)
        f.seek(size - cap // 2)
        data = head + f"\n[... {size - cap} bytes cut ...]\n".encode() + f.read()
    return data.decode("utf-8", errors="replace")


def _reason(rc: int | None, stderr: str) -> str | None:
    lines = stderr.strip().splitlines()
    last = lines[-1] if lines else ""
    if rc == -signal.SIGXCPU:
        return "cpu limit"
    if rc == -signal.SIGXFSZ or "[Errno 27] File too large" in stderr:
        return "file size limit"
    if last.startswith("MemoryError"):
        return "memory limit"
    if "PermissionError: sandbox:" in last:
        return "blocked: " + last.split("sandbox:", 1)[1].strip()
    if rc is not None and rc < 0:
        return "signal " + signal.Signals(-rc).name
    return None


class _Child:
    """One isolated Python process (see the module docstring): its program in a fresh directory,
    hard limits, stdout/stderr in bounded files, a results pipe it writes (COSPEC_RESULTS_FD) and,
    with `requests`, a pipe it reads (COSPEC_REQUESTS_FD)."""

    def __init__(self, code: str, *, bwrap: str | None, run_name: str, memory_mb: int, cpu: int,
                 max_file_bytes: int, audit_hook: bool, requests: bool):
        self.bwrap = bwrap
        self.root = os.path.realpath(tempfile.mkdtemp(prefix="cospec-sbx-"))
        os.chmod(self.root, 0o755)
        with open(os.path.join(self.root, "main.py"), "w", encoding="utf-8") as f:
            f.write(code)
        self.results_read, self.results_write = os.pipe()
        self.requests_read, self.requests_write = os.pipe() if requests else (-1, -1)
        work = WORK if bwrap else self.root
        boot = _BOOT if audit_hook else _BOOT.replace("sys.addaudithook(_hook)", "pass")
        argv = [os.path.realpath(sys.executable), "-I", "-S", "-c", boot,
                os.path.join(SRC if bwrap else self.root, "main.py"), run_name, work,
                str(memory_mb << 20), str(cpu), str(max_file_bytes), str(self.results_write), str(self.requests_read)]
        self.argv = [bwrap, *_isolation_args(self.root), *argv] if bwrap else argv
        self.out, self.err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": self.root}
        # A session of its own: a timeout kills bubblewrap and with it the whole namespace
        # (or, unisolated, the program's process group).
        keep = tuple(fd for fd in (self.results_write, self.requests_read) if fd >= 0)
        self.proc = subprocess.Popen(self.argv, cwd=self.root, env=env, stdin=subprocess.DEVNULL, stdout=self.out,
                                     stderr=self.err, start_new_session=True, close_fds=True, pass_fds=keep)
        for fd in keep:  # the child's ends: closed here, so the pipes end when the child does
            os.close(fd)
        self.results_write = self.requests_read = -1

    def wait_or_time_out(self, wall: float) -> bool:
        """Wait for the program up to `wall` seconds; True when it was still running."""
        try:
            self.proc.wait(timeout=wall)
            return False
        except subprocess.TimeoutExpired:
            return True

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def signalled(self, rc: int) -> int:
        # bubblewrap exits with 128 + N when the program is killed by signal N
        return 128 - rc if self.bwrap is not None and rc > 128 else rc

    def close(self) -> None:
        for fd in (self.results_write, self.requests_read, self.requests_write):
            if fd >= 0:
                os.close(fd)
        self.results_write = self.requests_read = self.requests_write = -1
        self.out.close()
        self.err.close()
        shutil.rmtree(self.root, ignore_errors=True)


def _collector(fd: int, limit: int, into: bytearray) -> threading.Thread:
    """Read `fd` while the child runs (a full pipe would block it), keeping at most limit + 1 bytes."""
    def collect():
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return
            if len(into) <= limit:
                into.extend(chunk[:limit + 1 - len(into)])

    return threading.Thread(target=collect, daemon=True)


def _time_limits(bwrap: str | None, timeout: float, setup: float) -> tuple[float, int]:
    """(wall-clock limit, CPU seconds limit): namespace set-up takes a moment, and the CPU limit
    is a backstop for the wall-clock timeout that must never fire first."""
    wall = timeout + (setup if bwrap else 0.0)
    return wall, math.ceil(wall) + 1


def _need_isolation(allow_unisolated: bool | None) -> str | None:
    bwrap = _bwrap()
    if bwrap is None and not _allowed_unisolated(allow_unisolated):
        raise SandboxUnavailableError(
            "generated code runs only inside bubblewrap (install Debian's or your distribution's `bubblewrap`, "
            "with user namespaces enabled); to run it without isolation anyway, pass --unsafe-code-execution or "
            f"set {UNSAFE_ENV}=1 (unsafe: the code can then read and change your files)")
    return bwrap


def run_python(code: str, timeout: float = 5.0, memory_mb: int = 256, *, pass_code: int = 0,
               run_name: str = "__main__", max_output: int = 64 << 10, max_file_bytes: int = 1 << 20,
               allow_unisolated: bool | None = None, audit_hook: bool = True) -> SandboxResult:
    """Run `code` as a Python program, isolated; see the module docstring.

    `run_name` is the program's __name__: scorers use a name other than "__main__" so that
    `if __name__ == "__main__":` blocks in generated code do not run (as in the HumanEval harness).
    `pass_code` is the exit status that counts as passing (the program decides it: a verdict only
    for trusted code; run_split decides a test's verdict where generated code cannot reach it).
    What the program writes to the file descriptor named by its COSPEC_RESULTS_FD variable comes
    back in `SandboxResult.results` (at most max_file_bytes). `audit_hook=False` leaves out the
    in-process guard rail (tests of the isolation itself). Raises SandboxUnavailableError when it
    cannot isolate and the unisolated fallback is not allowed.
    """
    bwrap = _need_isolation(allow_unisolated)
    wall, cpu = _time_limits(bwrap, timeout, setup=1.0)
    child = _Child(code, bwrap=bwrap, run_name=run_name, memory_mb=memory_mb, cpu=cpu, max_file_bytes=max_file_bytes,
                   audit_hook=audit_hook, requests=False)
    collected = bytearray()
    reader = _collector(child.results_read, max_file_bytes, collected)
    start = time.monotonic()
    try:
        child.start()
        reader.start()
        timed_out = child.wait_or_time_out(wall)
        child.kill()
        rc = child.proc.wait()
        reader.join(5)  # every writer is gone once the namespace is
        elapsed = time.monotonic() - start
        stdout, stderr = _read_capped(child.out, max_output), _read_capped(child.err, max_output)
    finally:
        if not reader.is_alive():  # (a reader still blocked keeps its descriptor: never close under it)
            os.close(child.results_read)
        child.close()
    reason = "timeout" if timed_out else _reason(child.signalled(rc), stderr)
    return SandboxResult(passed=not timed_out and rc == pass_code, returncode=rc, stdout=stdout, stderr=stderr,
                         timed_out=timed_out, killed_reason=reason, elapsed=elapsed,
                         results=bytes(collected[:max_file_bytes]) if len(collected) <= max_file_bytes else None,
                         isolated=bwrap is not None)


MAX_MESSAGE = 1 << 20  # one call or reply between the two processes of run_split


def _relay(src: int, dst: int, budget: list[int]) -> threading.Thread:
    """Copy newline-ended messages from fd src to fd dst until src ends or a message (or the run's
    total, budget[0]) grows too large; then close dst, so the reader there sees the end."""
    def relay():
        pending = b""
        try:
            while True:
                chunk = os.read(src, 1 << 16)
                if not chunk:
                    return
                budget[0] -= len(chunk)
                pending += chunk
                if budget[0] < 0 or (b"\n" not in pending and len(pending) > MAX_MESSAGE):
                    return
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if len(line) > MAX_MESSAGE:
                        return
                    os.write(dst, line + b"\n")
        except OSError:  # the other side is gone
            return
        finally:
            os.close(dst)

    return threading.Thread(target=relay, daemon=True)


def run_split(candidate: str, checker: str, timeout: float = 5.0, memory_mb: int = 256, *, pass_code: int,
              max_output: int = 64 << 10, allow_unisolated: bool | None = None, audit_hook: bool = True,
              max_traffic: int = 16 << 20) -> SandboxResult:
    """Run untrusted `candidate` and trusted `checker` as two isolated processes that share
    nothing but a line channel this process relays: the checker sends calls, the candidate answers
    them. The verdict is the checker's exit status (`pass_code`): no code of the candidate's ever
    runs in the process that decides it, so an early exit, a forged status, rewritten output or a
    disabled guard in the candidate only ever fails the test. (tasks/code.py writes both programs:
    its calls and answers carry values, never code.) stdout/stderr are the candidate's, the
    checker's stderr follows them for a failing test's traceback."""
    bwrap = _need_isolation(allow_unisolated)
    wall, cpu = _time_limits(bwrap, timeout, setup=2.0)  # two namespaces
    common = dict(bwrap=bwrap, memory_mb=memory_mb, cpu=cpu, max_file_bytes=1 << 20, audit_hook=audit_hook,
                  requests=True)
    cand = _Child(candidate, run_name="__candidate__", **common)
    check = _Child(checker, run_name="__checker__", **common)
    budget = [max_traffic]
    relays = [_relay(check.results_read, cand.requests_write, budget),
              _relay(cand.results_read, check.requests_write, budget)]
    start = time.monotonic()
    try:
        cand.start()
        check.start()
        for r in relays:
            r.start()
        cand.requests_write = check.requests_write = -1  # the running relays own them now
        timed_out = check.wait_or_time_out(wall)
        for child in (cand, check):
            child.kill()
        rc = check.proc.wait()
        cand.proc.wait()
        for r in relays:
            r.join(5)
        elapsed = time.monotonic() - start
        stdout = _read_capped(cand.out, max_output)
        stderr = _read_capped(cand.err, max_output // 2) + _read_capped(check.err, max_output // 2)
    finally:
        for child, r in ((cand, relays[1]), (check, relays[0])):
            if not r.is_alive():
                os.close(child.results_read)
            child.close()
    reason = "timeout" if timed_out else _reason(check.signalled(rc), stderr)
    return SandboxResult(passed=not timed_out and rc == pass_code, returncode=rc, stdout=stdout, stderr=stderr,
                         timed_out=timed_out, killed_reason=reason, elapsed=elapsed, results=b"",
                         isolated=bwrap is not None)
