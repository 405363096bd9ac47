"""A `cospec-local serve` process started on a free port and stopped at the end: what the server's
tests and bench/serve_load.py run requests against. It starts the CLI in a child process and
imports nothing of the server itself."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
import urllib.request

CLI = [sys.executable, "-m", "cospec_local.cli"]


def _rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return int(next(line.split()[1] for line in f if line.startswith("VmRSS:")))
    except (OSError, StopIteration):
        return 0


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
        return sum(_rss_kib(pid) for pid in [self.proc.pid, *self.children()])

    def children(self) -> list[int]:
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        if int(f.read().rsplit(")", 1)[1].split()[1]) == self.proc.pid:
                            found.append(int(entry))
                except (OSError, IndexError, ValueError):
                    pass
        return found

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
