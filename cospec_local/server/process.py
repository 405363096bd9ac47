"""A `cospec-local serve` process started on a free port and stopped at the end, and a
`cospec-local rpc-server`: what the server's tests and bench/serve_load.py and serve_soak.py run
requests against. They start the CLI in child processes and import nothing of the server itself.
The process-tree readers are Linux's /proc."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request

CLI = [sys.executable, "-m", "cospec_local.cli"]


def rss_kib(pid: int) -> int:
    """Resident memory of one process (VmRSS), 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return int(next(line.split()[1] for line in f if line.startswith("VmRSS:")))
    except (OSError, StopIteration):
        return 0


def command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat after the command name (which may hold spaces): field 4 (ppid) is [1]."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def children_of(pid: int) -> list[int]:
    """Child processes, oldest first."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = _stat_fields(int(entry))
                if int(fields[1]) == pid:
                    found.append((int(fields[19]), int(entry)))  # field 22: start time in clock ticks
            except (OSError, IndexError, ValueError):
                pass
    return [child for _, child in sorted(found)]


def process_age(pid: int) -> float | None:
    """Seconds since the process started (None once it is gone)."""
    try:
        started_ticks = int(_stat_fields(pid)[19])  # field 22: start time in clock ticks after boot
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    return uptime - started_ticks / os.sysconf("SC_CLK_TCK")


def descendants_of(pid: int) -> list[int]:
    found, todo = [], children_of(pid)
    while todo:
        child = todo.pop()
        found.append(child)
        todo += children_of(child)
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_rpc_server(port: int | None = None, host: str = "127.0.0.1",
                     prefix: tuple[str, ...] = ()) -> tuple[subprocess.Popen, str]:
    """`cospec-local rpc-server` on host:port (a free loopback port by default), once it listens:
    (the process, "HOST:PORT"). `prefix` runs it through another command that ends in an exec of
    it, such as `ip netns exec NAME`, so the process is still the rpc-server's own."""
    port = port or free_port()
    proc = subprocess.Popen([*prefix, *CLI, "rpc-server", "-H", host, "-p", str(port), "-t", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("rpc-server exited: " + proc.stderr.read())
        try:
            socket.create_connection((host, port), timeout=1).close()
            return proc, f"{host}:{port}"
        except OSError:
            time.sleep(0.1)
    proc.kill()
    proc.wait()
    raise RuntimeError("rpc-server did not listen")


class ServerProcess:
    def __init__(self, *args: str, env: dict | None = None, timeout: float = 120):
        self.proc = subprocess.Popen([*CLI, "serve", "--port", "0", "-t", "1", *map(str, args)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})})
        self.log: list[str] = []
        deadline = time.monotonic() + timeout
        self.url = None
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.log.append(line)
            found = re.search(r"on (http://\S+)", line)
            if found:
                self.url = found.group(1)
                break
        if self.url is None:
            self.stop()
            raise RuntimeError("the server did not start:\n" + "".join(self.log))
        # Keep reading its log, so that a full pipe never blocks the server.
        threading.Thread(target=lambda: self.log.extend(self.proc.stderr), daemon=True).start()
        self.api = self.url + "/v1"

    def get(self, path: str, headers: dict | None = None):
        request = urllib.request.Request(self.url + path, headers=headers or {})
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()

    def rss_kib(self) -> int:
        """Resident memory of the server and its engine processes together."""
        return sum(rss_kib(pid) for pid in [self.proc.pid, *self.children()])

    def children(self) -> list[int]:
        return children_of(self.proc.pid)

    def engine_pids(self) -> list[int]:
        """The engine processes (workers.py starts them with multiprocessing's spawn), oldest first."""
        return [pid for pid in self.children() if "multiprocessing.spawn" in command_line(pid)]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
