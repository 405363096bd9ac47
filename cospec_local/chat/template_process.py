"""Chat templates render in a child process with hard limits.

A template is code from an untrusted model file. The in-process sandbox
(template.py) refuses what it can see coming, but a loop that makes no
calls never reaches its deadline checks, and a small template can build a huge
value before its size is checked. So the engine renders in a separate Python
process whose address space is capped (RLIMIT_AS) and whose every render has a
wall-clock limit: a render that runs over is killed with its process, which
the next render replaces. The child runs the same sandboxed renderer, so no
template code runs in either process; it inherits no environment.

Protocol: one JSON object a line each way. Request {"source", "bos", "eos",
"messages", "add_generation_prompt", "compile_only", "tools"}; answer {"text"} or
{"error"}.
"""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from typing import Any

from .template import ChatTemplateError

MEMORY_LIMIT_BYTES = 768 << 20  # the child's whole address space: Python, jinja2 and the render
RENDER_WALL_SECONDS = 3.0       # per request, start-up of a fresh child included
CPU_SECONDS = 600               # the child's lifetime CPU (it is replaced when it dies)


# The child imports template.py alone (stdlib and jinja2), not this package and its
# native extension, and lowers its own hard limits before it reads a request.
_CHILD = ("import resource, sys; "
          "[resource.setrlimit(r, (v, v)) for r, v in ((resource.RLIMIT_AS, {mem}), (resource.RLIMIT_CPU, {cpu}), "
          "(resource.RLIMIT_CORE, 0))]; "
          "sys.path.insert(0, {dir!r}); import template; template.serve_requests()")


class TemplateProcess:
    """One renderer child per process, started on first use and restarted after a failure."""

    def __init__(self):
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def _start(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            code = _CHILD.format(mem=MEMORY_LIMIT_BYTES, cpu=CPU_SECONDS, dir=os.path.dirname(os.path.abspath(__file__)))
            self._proc = subprocess.Popen([sys.executable, "-I", "-c", code], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env={},
                                          start_new_session=True, close_fds=True)
        return self._proc

    def _kill(self) -> None:
        if self._proc is not None:
            try:
                self._proc.kill()
                self._proc.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                pass
            self._proc = None

    def request(self, payload: dict[str, Any]) -> str:
        line = (json.dumps(payload) + "\n").encode()
        with self._lock:
            proc = self._start()
            deadline = time.monotonic() + RENDER_WALL_SECONDS
            try:
                proc.stdin.write(line)
                proc.stdin.flush()
                answer = b""
                while not answer.endswith(b"\n"):
                    left = deadline - time.monotonic()
                    ready, _, _ = select.select([proc.stdout], [], [], max(left, 0))
                    if not ready:
                        self._kill()
                        raise ChatTemplateError(f"chat template exceeded the render time limit ({RENDER_WALL_SECONDS:g} s)")
                    chunk = os.read(proc.stdout.fileno(), 1 << 20)
                    if not chunk:
                        self._kill()
                        raise ChatTemplateError("chat template exhausted the renderer's limits (memory or CPU); "
                                                "the renderer was restarted")
                    answer += chunk
            except (BrokenPipeError, OSError) as exc:
                self._kill()
                raise ChatTemplateError(f"chat template renderer failed: {exc}") from None
        out = json.loads(answer)
        if "error" in out:
            raise ChatTemplateError(out["error"])
        return out["text"]


_PROCESS = TemplateProcess()


class IsolatedChatTemplate:
    """A chat template whose compilation and rendering run in the limited child process;
    the same interface as ChatTemplate (`render`, `source`)."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = ""):
        if not isinstance(source, str):
            raise ChatTemplateError(f"chat template must be a string, not {type(source).__name__}")
        self.source, self.bos_token, self.eos_token = source, bos_token, eos_token
        self._call(messages=[], add_generation_prompt=False, compile_only=True)

    def _call(self, **payload) -> str:
        return _PROCESS.request({"source": self.source, "bos": self.bos_token, "eos": self.eos_token, **payload})

    def render(self, messages: list[dict], add_generation_prompt: bool = True, tools: list | None = None) -> str:
        try:
            json.dumps([messages, tools])
        except (TypeError, ValueError) as exc:
            raise ChatTemplateError(f"messages and tools must be JSON data: {exc}") from None
        return self._call(messages=messages, add_generation_prompt=bool(add_generation_prompt), compile_only=False,
                          tools=tools)
