"""Run untrusted Python (model-written code, benchmark tests) in a limited child process.

Nothing here ever exec()s or eval()s the code in this process. `run_python` writes the code to
a fresh temporary directory and runs it with `python -I -S` (isolated mode, no site-packages, so
only the standard library is importable) under resource limits:

- RLIMIT_AS (memory), RLIMIT_CPU, RLIMIT_FSIZE (largest file, stdout/stderr included), RLIMIT_NOFILE,
  RLIMIT_CORE=0 and RLIMIT_NPROC=0 (no new processes or threads);
- its own process group (setsid), so a timeout kills everything the program started;
- an environment holding only PATH, LANG, HOME and TMPDIR;
- stdout/stderr go to files bounded by RLIMIT_FSIZE and come back capped to `max_output` bytes.

The kernel does not apply RLIMIT_NPROC to root (uid 0 / CAP_SYS_RESOURCE), and dropping to an
unprivileged user is not always possible (the interpreter may live under a 0700 home directory).
So a startup audit hook (sys.addaudithook, which the program cannot remove) also refuses process
creation, signals to other processes, ctypes, sockets, raising rlimits, and writes, deletes or
renames outside the temporary directory. These are guard rails against mistakes in generated code,
not a boundary against code written to escape: for that, use a container or an unprivileged user.
"""
from __future__ import annotations

import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

# Runs inside the child before the program. argv: main.py, run_name, root directory.
_BOOT = r'''
import os, sys, runpy
sys.dont_write_bytecode = True
_path, _run_name, _root = sys.argv[1:4]
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


def _limits(timeout: float, memory_mb: int, max_file_bytes: int):
    cpu = math.ceil(timeout) + 1  # backstop for the wall-clock timeout

    def apply():  # runs in the child between fork and exec
        os.setsid()  # own process group: killpg reaches every descendant
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_bytes, max_file_bytes))
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))  # ignored by the kernel for root
    return apply


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


def run_python(code: str, timeout: float = 5.0, memory_mb: int = 256, *, pass_code: int = 0,
               run_name: str = "__main__", max_output: int = 64 << 10,
               max_file_bytes: int = 1 << 20) -> SandboxResult:
    """Run `code` as a Python program in a fresh temporary directory; see the module docstring.

    `run_name` is the program's __name__: scorers use a name other than "__main__" so that
    `if __name__ == "__main__":` blocks in generated code do not run (as in the HumanEval harness).
    `pass_code` is the exit status that counts as passing; scorers end their program with
    `raise SystemExit(pass_code)` so that a stray sys.exit(0) in generated code is not a pass.
    """
    root = os.path.realpath(tempfile.mkdtemp(prefix="cospec-sbx-"))
    path = os.path.join(root, "main.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(code)
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": root, "TMPDIR": root}
    argv = [sys.executable, "-I", "-S", "-c", _BOOT, path, run_name, root]
    start = time.monotonic()
    try:
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(argv, cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                    preexec_fn=_limits(timeout, memory_mb, max_file_bytes))
            timed_out = False
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            try:  # the whole group: anything the program started dies with it
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            rc = proc.wait()
            elapsed = time.monotonic() - start
            stdout, stderr = _read_capped(out, max_output), _read_capped(err, max_output)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    reason = "timeout" if timed_out else _reason(rc, stderr)
    return SandboxResult(passed=not timed_out and rc == pass_code, returncode=rc,
                         stdout=stdout, stderr=stderr, timed_out=timed_out, killed_reason=reason, elapsed=elapsed)
