"""A soak test of `cospec-local serve` under faults, bounded in time and in requests.

Streaming clients send fixed-seed requests back to back while an engine process is killed every
`--kill-every` seconds, bad requests are mixed in and one client leaves mid-stream every few
seconds. A second run puts the target's layers on `cospec-local rpc-server` in a network
namespace of its own (a veth pair, as a second machine would be) and stops and restarts that
rpc-server mid-run.

    .venv/bin/python bench/serve_soak.py --out soak.json      # 10 minutes, 8 clients, 2 engines; then the rpc run
    .venv/bin/python bench/serve_soak.py --seconds 30 --kill-every 10 --clients 4 --rpc off
    .venv/bin/python bench/serve_soak.py --rpc only --rpc-seconds 30 --rpc-outage 5
    .venv/bin/python bench/serve_soak.py -- -m smollm2-135m -c 1024

Everything after `--` goes to `cospec-local serve`, in both runs (the rpc run always has one
engine: an rpc-server serves one client at a time). Traffic goes to loopback and, in the rpc run,
to the veth addresses this script gives itself, nothing else; the namespace and the veth pair
are removed at the end, on failure and on Ctrl-C too. The rpc run needs root (`ip netns`);
without it the run is skipped and the reason printed.

Before the faults, each request of the fixed set is sent once by one client (the quiet
server's reply, the reference). Then every reply that completes must equal its reference.

Goals; the exit status is 1 when one is missed:
- no 5xx but 503, whose causes are designed: a full queue (server_busy), an engine process that
  ended mid-request and starts again (engine_died), an engine that cannot start, e.g. while the
  rpc-server is down (engine_unavailable). A stream whose engine died gets engine_died as its
  last event (its status, 200, was sent before);
- no completed reply that differs from its reference;
- every bad request answered with its 4xx (or 503, where it needed an engine that was down);
- /metrics agrees with what the clients saw (each check below is exact or a stated bound);
- memory flat: each process's last resident size within max(+25%, +30 MiB) of its first,
  sampled from the end of the reference pass on;
- no process left behind, by a killed engine or by the stopped server.
"""
from __future__ import annotations

import argparse
import ipaddress
import itertools
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from cospec_local.server.process import (ServerProcess, command_line, descendants_of, process_age, rss_kib,
                                         start_rpc_server)

PROMPTS = ["Tom has 5 apples and eats 2. How many are left?", "What is 12 + 30?",
           "Write a Python function that returns the square of x.",
           "Chloe has 7 candles and buys 24 more. How many candles does she have?"]
REQUEST_TIMEOUT_S = 120        # one request, whole or streamed; a soak run ends at most this much after its time
WHOLE_EVERY = 4                # every 4th request of a client is not streamed: both paths meet the faults
DISCONNECT_AFTER_CHUNKS = 3    # the leaving client reads this many events, then closes the connection
RETRY_AFTER_CAP_S = 2          # a 503's Retry-After is honoured, up to this
IDLE_WAIT_S = 30               # after the clients stop, for the last (aborted) generations to end
FLAT_RATIO, FLAT_SLACK_KIB = 0.25, 30 * 1024  # see is_flat
WARM_AGE_S = 5                 # a process's memory is judged from its first sample at this age on (see is_flat)
RPC_PORT = 50052               # in a namespace of its own, always free
RPC_SUBNETS = ipaddress.ip_network("10.213.0.0/16")  # the /30 for the veth pair comes from here, unused ones only


# ---------------------------------------------------------------- requests

@dataclass(frozen=True)
class Item:
    """One request of the fixed set; its reply must always be the same."""

    path: str
    body_json: str  # the body as JSON text: hashable

    @property
    def chat(self) -> bool:
        return self.path == "/v1/chat/completions"

    def body(self, stream: bool) -> dict:
        body = json.loads(self.body_json)
        if stream:
            body.update(stream=True, stream_options={"include_usage": True})
        return body

    def label(self) -> str:
        return f"{self.path} {self.body_json}"


def fixed_items(model: str, has_draft: bool, max_tokens: int) -> list[Item]:
    """Greedy requests with the server's own mode and arbiter, and seeded ones at temperature 0.8.
    Seeded speculative requests name FLy: an arbiter that keeps mismatches chooses block lengths
    from acceptance counts alone, while the target arbiter's lengths follow measured speed, so a
    seeded reply would depend on the load (the default `auto` is the target arbiter on a pair
    without a learned one)."""
    items = []
    for i, prompt in enumerate(PROMPTS):
        messages = [{"role": "user", "content": prompt}]
        variants = [{"temperature": 0}, {"temperature": 0.8, "seed": 1000 + i, "mode": "target-only"}]
        if has_draft:
            variants.append({"temperature": 0.8, "seed": 2000 + i, "arbiter": "fly"})
        for extra in variants:
            body = {"model": model, "messages": messages, "max_tokens": max_tokens, **extra}
            items.append(Item("/v1/chat/completions", json.dumps(body)))
    body = {"model": model, "prompt": PROMPTS[3] + "\n", "max_tokens": max_tokens, "temperature": 0}
    items.append(Item("/v1/completions", json.dumps(body)))
    return items


@dataclass
class Reply:
    status: int | None                # None: no answer (a transport error)
    text: str | None = None           # the whole text, for a reply that completed
    finish_reason: str | None = None
    completion_tokens: int = 0
    error: dict | None = None         # the error body (of a non-200 answer or of a stream's last event)
    retry_after: float = 0.0
    transport: str | None = None

    @property
    def completed(self) -> bool:
        return self.status == 200 and self.error is None and self.text is not None


def stream_events(response):
    for line in response.iter_lines():
        if line.startswith("data:"):
            yield line[5:].strip()


def read_reply(response, chat: bool, stream: bool) -> Reply:
    if response.status_code != 200:
        response.read()
        try:
            error = response.json().get("error")
        except ValueError:
            error = {"message": response.text[:200]}
        return Reply(response.status_code, error=error,
                     retry_after=float(response.headers.get("retry-after", 0) or 0))
    if not stream:
        response.read()
        body = response.json()
        choice = body["choices"][0]
        text = choice["message"]["content"] if chat else choice["text"]
        return Reply(200, text, choice["finish_reason"], body["usage"]["completion_tokens"])
    pieces, finish, tokens = [], None, 0
    for data in stream_events(response):
        if data == "[DONE]":
            return Reply(200, "".join(pieces), finish, tokens)
        chunk = json.loads(data)
        if "error" in chunk:
            return Reply(200, error=chunk["error"])
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
        for choice in chunk.get("choices", []):
            pieces.append((choice["delta"].get("content") if chat else choice.get("text")) or "")
            finish = choice.get("finish_reason") or finish
    return Reply(200, error={"code": "stream_ended_without_done", "message": "no [DONE]"})


# ---------------------------------------------------------------- bad requests

def bad_requests(model: str, n_ctx: int) -> list[tuple[str, str, dict, set[int], bool]]:
    """(name, method and path, httpx arguments, expected statuses, needs an engine). A request
    that needs an engine (its prompt is tokenized there) may also get a 503."""
    chat = "POST /v1/chat/completions"
    hello = [{"role": "user", "content": "hi"}]

    def js(**body):
        return {"json": {"model": model, "messages": hello, **body}}

    raw = {"headers": {"Content-Type": "application/json"}}
    cut_short = b'{"model": "' + model.encode() + b'", "messages": ['
    return [
        ("malformed JSON", chat, {"content": cut_short, **raw}, {400}, False),
        ("model a number", chat, {"json": {"model": 5, "messages": hello}}, {400}, False),
        ("unknown arbiter", chat, js(arbiter="no-such-arbiter"), {400}, False),
        ("arbiter as a path", chat, js(arbiter="/etc"), {400}, False),
        ("max_tokens negative", chat, js(max_tokens=-5), {400}, False),
        ("temperature a string", chat, js(temperature="hot"), {400}, False),
        ("messages a string", chat, {"json": {"model": model, "messages": "hi"}}, {400}, False),
        ("content a number", chat, {"json": {"model": model, "messages": [{"role": "user", "content": 5}]}},
         {400}, False),
        ("n = 0", chat, js(n=0), {400}, False),
        ("prompt over the context", chat, js(messages=[{"role": "user", "content": "seven " * n_ctx}],
                                             max_tokens=8), {400}, True),
        ("token id outside the vocabulary", "POST /v1/completions",
         {"json": {"model": model, "prompt": [10**9], "max_tokens": 4}}, {400}, True),
        ("text/plain body", chat, {"content": b"{}", "headers": {"Content-Type": "text/plain"}}, {415}, False),
        ("body over 8 MiB", chat, {"content": b" " * (9 << 20), **raw}, {413}, False),
        ("GET on a POST endpoint", "GET /v1/chat/completions", {}, {405}, False),
    ]


# ---------------------------------------------------------------- one run

@dataclass
class Tally:
    """What the clients saw, counted as /metrics counts it: (path, status) -> requests."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    by_status: Counter = field(default_factory=Counter)

    def add(self, path: str, status: int | None) -> None:
        if status is not None:
            with self.lock:
                self.by_status[(path, status)] += 1


class SoakRun:
    """One server under the clients and the faults; `report()` says what happened."""

    def __init__(self, server: ServerProcess, args, seconds: float, engines: int, rpc: "RpcServer | None" = None):
        self.server, self.args, self.seconds, self.engines, self.rpc = server, args, seconds, engines, rpc
        self.url = server.url
        self.tally = Tally()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.started = time.monotonic()
        self.started_soak = self.deadline = None  # set when the faults begin, after the reference
        self.tickets = args.max_requests
        self.count = Counter()                 # outcome -> requests
        self.statuses = Counter()              # "503 engine_died" etc.: the answers other than 200 to good requests
        self.cut = Counter()                   # in-stream error code -> streams
        self.completed_times: list[float] = []
        self.completion_tokens = 0
        self.differing: list[dict] = []
        self.failures: list[str] = []          # other 5xx, wrong answers to bad requests, transport errors
        self.bad = Counter()
        self.disconnects = Counter()
        self.kills: list[dict] = []
        self.rpc_events: list[dict] = []
        self.memory: dict[int, dict] = {}
        self.reference: dict[Item, Reply] = {}
        self.left_behind: list[dict] = []
        self.scraped: dict = {}                # /metrics at the end: (name, labels) -> value
        info = self.get("/v1/models")[1]["data"][0]
        self.model, self.n_ctx = info["id"], info["cospec"]["n_ctx"]
        self.has_draft = "speculative" in info["cospec"]["modes"]
        self.items = fixed_items(self.model, self.has_draft, args.max_tokens)
        self.long_max_tokens = self.n_ctx - 64  # the leaving client's request runs until it leaves

    # ------------------------------------------------ plumbing

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def get(self, path: str):
        with httpx.Client(base_url=self.url, timeout=30) as http:
            r = http.get(path)
        self.tally.add(path, r.status_code)
        return r.status_code, (r.json() if path != "/metrics" else r.text)

    def running(self) -> bool:
        """True while there is time and a request left in the budget (which this call takes)."""
        if self.stop.is_set() or time.monotonic() >= self.deadline:
            return False
        with self.lock:
            if self.tickets <= 0:
                return False
            self.tickets -= 1
            return True

    def pause(self, seconds: float) -> None:
        self.stop.wait(max(0.0, min(seconds, self.deadline - time.monotonic())))

    def send(self, http, item: Item, stream: bool) -> Reply:
        try:
            with http.stream("POST", item.path, json=item.body(stream)) as r:
                self.tally.add(item.path, r.status_code)
                return read_reply(r, item.chat, stream)
        except httpx.TransportError as exc:
            return Reply(None, transport=f"{type(exc).__name__}: {exc}")

    # ------------------------------------------------ the reference

    def collect_reference(self) -> None:
        with httpx.Client(base_url=self.url, timeout=REQUEST_TIMEOUT_S) as http:
            for item in self.items:
                reply = self.send(http, item, stream=True)
                if not reply.completed:
                    raise RuntimeError(f"the quiet server did not answer {item.label()}: {reply}")
                self.reference[item] = reply
                self.note_completed(reply)

    def note_completed(self, reply: Reply) -> None:
        with self.lock:
            self.completed_times.append(self.elapsed())
            self.completion_tokens += reply.completion_tokens

    # ------------------------------------------------ the clients

    def client(self, i: int) -> None:
        n = 0
        with httpx.Client(base_url=self.url, timeout=REQUEST_TIMEOUT_S) as http:
            while self.running():
                item = self.items[(i + n) % len(self.items)]
                stream = n % WHOLE_EVERY != WHOLE_EVERY - 1
                n += 1
                reply = self.send(http, item, stream)
                self.record(item, stream, reply)
                if reply.status == 503:
                    self.pause(min(reply.retry_after or 1, RETRY_AFTER_CAP_S))

    def record(self, item: Item, stream: bool, reply: Reply) -> None:
        kind = "streamed" if stream else "whole"
        with self.lock:
            if reply.completed:
                self.count[f"completed ({kind})"] += 1
                expected = self.reference[item]
                if (reply.text, reply.finish_reason) != (expected.text, expected.finish_reason):
                    self.differing.append({"request": item.label(), "stream": stream, "reply": reply.text,
                                           "finish_reason": reply.finish_reason, "reference": expected.text,
                                           "reference_finish_reason": expected.finish_reason})
            elif reply.status is None:
                self.failures.append(f"transport error: {reply.transport}")
            elif reply.status == 200:
                code = (reply.error or {}).get("code")
                self.cut[code] += 1
                if code != "engine_died":
                    self.failures.append(f"stream ended with {reply.error}")
            else:
                self.statuses[f"{reply.status} {(reply.error or {}).get('code')}"] += 1
                if reply.status != 503:
                    self.failures.append(f"{reply.status} for a valid request: {reply.error}")
        if reply.completed:
            self.note_completed(reply)

    def leaving_client(self) -> None:
        """Every --disconnect-every seconds: a long stream, left after a few events."""
        body = {"model": self.model, "messages": [{"role": "user", "content": "Once upon a time"}],
                "max_tokens": self.long_max_tokens, "ignore_eos": True, "temperature": 0, "stream": True}
        path = "/v1/chat/completions"
        while not self.stop.is_set():
            self.pause(self.args.disconnect_every)
            if not self.running():
                return
            outcome = "left mid-stream"
            try:
                with httpx.Client(base_url=self.url, timeout=REQUEST_TIMEOUT_S) as http:
                    with http.stream("POST", path, json=body) as r:
                        self.tally.add(path, r.status_code)
                        if r.status_code != 200:
                            r.read()
                            code = r.json()["error"].get("code")
                            outcome = f"answered {r.status_code} {code}"
                            with self.lock:
                                self.statuses[f"{r.status_code} {code}"] += 1
                        else:
                            seen = list(itertools.islice(stream_events(r), DISCONNECT_AFTER_CHUNKS))
                            ended = next((d for d in seen if d == "[DONE]" or '"error"' in d), None)
                            if ended is not None or len(seen) < DISCONNECT_AFTER_CHUNKS:
                                outcome = f"stream ended before the client left: {ended}"
            except httpx.TransportError as exc:
                outcome = f"transport error: {type(exc).__name__}: {exc}"
            with self.lock:
                self.disconnects[outcome] += 1
                if outcome.startswith("transport") or (outcome.startswith("answered 5")
                                                       and not outcome.startswith("answered 503")):
                    self.failures.append(f"leaving client: {outcome}")

    def bad_client(self) -> None:
        """Every --bad-every seconds, the next of the bad requests."""
        cases = bad_requests(self.model, self.n_ctx)
        n = 0
        with httpx.Client(base_url=self.url, timeout=REQUEST_TIMEOUT_S) as http:
            while not self.stop.is_set():
                self.pause(self.args.bad_every)
                if not self.running():
                    return
                name, target, kwargs, expected, needs_engine = cases[n % len(cases)]
                n += 1
                method, path = target.split()
                try:
                    r = http.request(method, path, **kwargs)
                except httpx.TransportError as exc:
                    with self.lock:
                        self.failures.append(f"bad request {name!r}: transport error {exc}")
                    continue
                self.tally.add(path, r.status_code)
                with self.lock:
                    if r.status_code in expected:
                        self.bad["answered as expected"] += 1
                    elif r.status_code == 503 and needs_engine:
                        self.bad["503 (needed an engine)"] += 1
                    else:
                        self.bad["wrong answer"] += 1
                        self.failures.append(f"bad request {name!r}: {r.status_code} (expected "
                                             f"{sorted(expected)}): {r.text[:200]}")

    # ------------------------------------------------ faults

    def engine_killer(self) -> None:
        """Every --kill-every seconds: SIGKILL the oldest engine process."""
        n = 1
        while not self.stop.is_set():
            self.stop.wait(max(0.0, self.started_soak + n * self.args.kill_every - time.monotonic()))
            if self.stop.is_set() or time.monotonic() >= self.deadline:
                return
            n += 1
            engines = self.server.engine_pids()
            if not engines:
                self.kills.append({"t": round(self.elapsed(), 1), "pid": None, "note": "no engine process to kill"})
                continue
            pid = engines[0]
            left = {child: command_line(child) for child in descendants_of(pid)}
            busy = self.get("/health")[1]["engines_busy"]
            self.sample_memory()  # its last size before the kill
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            self.kills.append({"t": round(self.elapsed(), 1), "pid": pid, "engines_busy": busy, "children": left})

    def rpc_outage(self) -> None:
        """At --rpc-stop-at of the run: SIGKILL the rpc-server; --rpc-outage seconds later, start it again."""
        stop_at = self.started_soak + self.args.rpc_stop_at * self.args.rpc_seconds
        self.stop.wait(max(0.0, stop_at - time.monotonic()))
        if self.stop.is_set():
            return
        proc = self.rpc.proc
        self.sample_memory()
        proc.kill()
        proc.wait()
        self.rpc_events.append({"t": round(self.elapsed(), 1), "event": "rpc-server killed", "pid": proc.pid})
        self.stop.wait(self.args.rpc_outage)
        if self.stop.is_set():
            return
        try:
            self.rpc.start()
        except RuntimeError as exc:
            self.rpc_events.append({"t": round(self.elapsed(), 1), "event": f"restart failed: {exc}"})
            with self.lock:
                self.failures.append(f"the rpc-server did not start again: {exc}")
            return
        self.rpc_events.append({"t": round(self.elapsed(), 1), "event": "rpc-server started again",
                                "pid": self.rpc.proc.pid})

    # ------------------------------------------------ memory

    def role(self, pid: int) -> str:
        if pid == self.server.proc.pid:
            return "server"
        if self.rpc is not None and pid in self.rpc.pids:
            return "rpc-server"
        cmd = command_line(pid)
        for needle, role in (("multiprocessing.spawn", "engine"), ("resource_tracker", "resource tracker"),
                             ("chat_template", "chat-template renderer")):
            if needle in cmd:
                return role
        return cmd[:60]

    def sample_memory(self) -> None:
        pids = [self.server.proc.pid, *descendants_of(self.server.proc.pid)]
        if self.rpc is not None and self.rpc.proc.poll() is None:
            pids.append(self.rpc.proc.pid)
        now = round(self.elapsed(), 1)
        for pid in pids:
            kib, age = rss_kib(pid), process_age(pid)
            if kib == 0 or age is None:
                continue
            with self.lock:
                entry = self.memory.setdefault(pid, {"role": self.role(pid), "samples": []})
                entry["samples"].append((now, kib, round(age, 1)))

    def memory_sampler(self) -> None:
        while not self.stop.wait(self.args.sample_every):
            self.sample_memory()

    # ------------------------------------------------ the run

    def soak(self) -> None:
        self.collect_reference()
        self.sample_memory()
        self.started_soak = time.monotonic()
        self.deadline = self.started_soak + self.seconds
        threads = [threading.Thread(target=self.client, args=(i,), daemon=True) for i in range(self.args.clients)]
        threads += [threading.Thread(target=self.leaving_client, daemon=True),
                    threading.Thread(target=self.bad_client, daemon=True),
                    threading.Thread(target=self.memory_sampler, daemon=True)]
        if self.args.kill_every > 0:
            threads.append(threading.Thread(target=self.engine_killer, daemon=True))
        if self.rpc is not None:
            threads.append(threading.Thread(target=self.rpc_outage, daemon=True))
        for t in threads:
            t.start()
        try:
            hard_stop = self.deadline + REQUEST_TIMEOUT_S + 10
            while any(t.is_alive() for t in threads[:self.args.clients + 2]):
                if time.monotonic() > hard_stop:
                    self.failures.append("clients still running past the time limit (a hung request)")
                    break
                time.sleep(0.5)
        finally:
            self.stop.set()
        for t in threads:
            t.join(5)
        # The last aborted generations end, the metrics settle.
        until = time.monotonic() + IDLE_WAIT_S
        while self.get("/health")[1]["engines_busy"] and time.monotonic() < until:
            time.sleep(0.2)
        self.sample_memory()
        self.scraped = self.scrape()

    def scrape(self) -> dict:
        _, text = self.get("/metrics")  # counted by the server before it renders: in both tallies
        values = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                values[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return values

    def check_left_behind(self) -> None:
        """Processes of killed engines (the chat-template renderer) still running."""
        for kill in self.kills:
            for pid, cmd in (kill.get("children") or {}).items():
                if cmd and command_line(pid) == cmd:
                    self.left_behind.append({"pid": pid, "of_killed_engine": kill["pid"], "command": cmd[:80]})

    # ------------------------------------------------ the report

    def metrics_checks(self) -> list[dict]:
        v = self.scraped
        checks = []
        server_counts = {(dict(labels)["endpoint"], int(dict(labels)["status"])): value
                         for (name, labels), value in v.items() if name == "cospec_requests_total"}
        for key in sorted(set(server_counts) | set(self.tally.by_status)):
            clients, server = self.tally.by_status.get(key, 0), server_counts.get(key, 0)
            checks.append({"metric": f'cospec_requests_total{{endpoint="{key[0]}",status="{key[1]}"}}',
                           "clients": clients, "metrics": server, "match": clients == server})
        completed = sum(n for k, n in self.count.items() if k.startswith("completed")) + len(self.reference)
        checks.append({"metric": "cospec_request_duration_seconds_count", "clients": completed,
                       "metrics": v.get(("cospec_request_duration_seconds_count", ())),
                       "match": v.get(("cospec_request_duration_seconds_count", ())) == completed})
        left = self.disconnects["left mid-stream"]
        # A left stream's generation counts as aborted, unless its engine was killed (or lost its rpc-server) first.
        faults = sum(bool(k.get("pid")) for k in self.kills) + sum("killed" in e["event"] for e in self.rpc_events)
        aborted = v.get(("cospec_generations_aborted_total", ()))
        checks.append({"metric": "cospec_generations_aborted_total",
                       "clients": f"{max(0, left - faults)}..{left} (streams left mid-way, less kills)",
                       "metrics": aborted, "match": aborted is not None and max(0, left - faults) <= aborted <= left})
        tokens = v.get(("cospec_completion_tokens_total", ()))
        most = self.completion_tokens + left * self.long_max_tokens
        checks.append({"metric": "cospec_completion_tokens_total",
                       "clients": f"{self.completion_tokens}..{most} (completed replies' usage, plus what "
                                  "streams left mid-way may have run)",
                       "metrics": tokens, "match": tokens is not None and self.completion_tokens <= tokens <= most})
        checks.append({"metric": "cospec_engines", "clients": self.engines, "metrics": v.get(("cospec_engines", ())),
                       "match": v.get(("cospec_engines", ())) == self.engines})
        return checks

    def memory_report(self) -> list[dict]:
        """Per process: its first sample once warm (WARM_AGE_S old), its last, its largest."""
        rows = []
        for pid, entry in sorted(self.memory.items(), key=lambda kv: kv[1]["samples"][0][0]):
            samples = entry["samples"]
            warm = [s for s in samples if s[2] >= WARM_AGE_S] or samples[-1:]
            (t0, start, _), (t1, end, _) = warm[0], samples[-1]
            row = {"pid": pid, "role": entry["role"], "first_s": t0, "last_s": t1, "start_kib": start, "end_kib": end,
                   "max_kib": max(s[1] for s in samples), "launch_kib": samples[0][1], "samples": len(samples),
                   "killed": any(k.get("pid") == pid for k in self.kills) or
                   any(e.get("pid") == pid and "killed" in e["event"] for e in self.rpc_events)}
            row["flat"] = is_flat(start, end) if len(warm) >= 2 else None  # None: not judged, too short a life
            rows.append(row)
        return rows

    def report(self) -> dict:
        self.check_left_behind()
        completed = sum(n for k, n in self.count.items() if k.startswith("completed"))
        first_kill = next((k["t"] for k in self.kills if k.get("pid")), None)
        first_restart = next((e["t"] for e in self.rpc_events if "again" in e["event"]), None)
        answered = self.tally.by_status  # every request this script sent, by path and status
        other_5xx = sum(n for (_, status), n in answered.items() if status >= 500 and status != 503)
        memory = self.memory_report()
        metrics = self.metrics_checks()
        report = {
            "engines": self.engines, "model": self.model, "n_ctx": self.n_ctx, "seconds": self.seconds,
            "clients": self.args.clients,
            "requests": {"sent": sum(answered.values()), "completed": completed, **dict(self.count),
                         "statuses": dict(self.statuses), "streams_cut": dict(self.cut)},
            "503": sum(n for (_, status), n in answered.items() if status == 503),
            "other_5xx": other_5xx,
            "replies": {"reference_requests": len(self.reference), "compared": completed,
                        "differing": len(self.differing), "first_differences": self.differing[:5],
                        "served_after_first_kill": sum(t > first_kill for t in self.completed_times)
                        if first_kill is not None else None,
                        "served_after_rpc_restart": sum(t > first_restart for t in self.completed_times)
                        if first_restart is not None else None},
            "bad_requests": dict(self.bad), "disconnects": dict(self.disconnects),
            "faults": {"engine_kills": [{k: v for k, v in kill.items() if k != "children"} for kill in self.kills],
                       "rpc": self.rpc_events},
            "memory": memory, "metrics": metrics, "left_behind": self.left_behind,
            "failures": self.failures[:50], "failure_count": len(self.failures),
        }
        report["goals"] = {
            "no other 5xx": other_5xx == 0 and not any("ended with" in f for f in self.failures),
            "no differing replies": not self.differing,
            "bad requests answered 4xx": self.bad["wrong answer"] == 0,
            "no transport errors": not any("transport" in f for f in self.failures),
            "metrics add up": bool(metrics) and all(c["match"] for c in metrics),
            "memory flat": all(r["flat"] is not False for r in memory),
            "no process left behind": not self.left_behind,
            "no other failure": len(self.failures) == 0,
        }
        return report


def is_flat(start_kib: int, end_kib: int) -> bool:
    """From its first sample at WARM_AGE_S on: a fresh engine loads its models and allocates
    llama.cpp's buffers in its first seconds, and its first requests fill Python's caches; growth
    beyond both a quarter of its size and 30 MiB after that is a leak."""
    return end_kib <= start_kib + max(FLAT_RATIO * start_kib, FLAT_SLACK_KIB)


# ---------------------------------------------------------------- the rpc-server's namespace

class Namespace:
    """A network namespace joined to this one by a veth pair on an unused /30: the host side has
    .1, the namespace side .2. Removed by close(), which is safe to call at any point."""

    def __init__(self):
        tag = os.getpid()
        self.name, self.host_if, self.ns_if = f"cospec-soak-{tag}", f"csk{tag}h", f"csk{tag}n"
        self.created = False
        used = _run(["ip", "-4", "-o", "addr", "show"]).stdout + _run(["ip", "-4", "route", "show", "table",
                                                                           "all"]).stdout
        subnet = next((s for s in RPC_SUBNETS.subnets(new_prefix=30)
                       if not any(str(h) in used for h in (s.network_address, *s.hosts()))), None)
        if subnet is None:
            raise OSError(f"no unused /30 in {RPC_SUBNETS}")
        self.host_address, self.ns_address = (str(h) for h in subnet.hosts())
        self.prefix = ("ip", "netns", "exec", self.name)
        steps = [["ip", "netns", "add", self.name],
                 ["ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if],
                 ["ip", "link", "set", self.ns_if, "netns", self.name],
                 ["ip", "addr", "add", f"{self.host_address}/30", "dev", self.host_if],
                 ["ip", "link", "set", self.host_if, "up"],
                 [*self.prefix, "ip", "addr", "add", f"{self.ns_address}/30", "dev", self.ns_if],
                 [*self.prefix, "ip", "link", "set", self.ns_if, "up"]]
        try:
            for step in steps:
                self.created = True
                done = _run(step)
                if done.returncode != 0:
                    raise OSError(f"`{shlex.join(step)}` failed: {done.stderr.strip()}")
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.created:
            _run(["ip", "netns", "del", self.name])  # takes the veth pair along
            _run(["ip", "link", "del", self.host_if])  # in case the pair was made before the move
            self.created = False

    def leftovers(self) -> list[str]:
        names = _run(["ip", "netns", "list"]).stdout.split()
        links = _run(["ip", "-o", "link", "show"]).stdout
        return [n for n in (self.name, self.host_if) if n in names or f" {n}@" in links or f" {n}:" in links]


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30)


def namespace_unavailable() -> str | None:
    """Why the rpc run cannot be made here, or None."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux's"
    if os.geteuid() != 0:
        return "making a network namespace and a veth pair needs root (ip netns add)"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    return None


class RpcServer:
    """`cospec-local rpc-server` in the namespace, on the namespace's address; every process it ran as."""

    def __init__(self, namespace: Namespace):
        self.namespace = namespace
        self.proc = None
        self.pids: list[int] = []

    @property
    def endpoint(self) -> str:
        return f"{self.namespace.ns_address}:{RPC_PORT}"

    def start(self) -> None:
        last = None
        for _ in range(10):  # the port may still be held for a moment after a kill
            try:
                self.proc, _ = start_rpc_server(RPC_PORT, self.namespace.ns_address, self.namespace.prefix)
                self.pids.append(self.proc.pid)
                return
            except RuntimeError as exc:
                last = exc
                time.sleep(1)
        raise RuntimeError(str(last))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# ---------------------------------------------------------------- main

def run_local(args, serve_args: list[str]) -> dict:
    server = ServerProcess("-np", str(args.engines), *serve_args)
    try:
        run = SoakRun(server, args, args.seconds, args.engines)
        run.soak()
    finally:
        tree = descendants_of(server.proc.pid)
        server.stop()
    report = run.report()
    report["left_after_stop"] = processes_left(tree)
    report["goals"]["no process left behind"] &= not report["left_after_stop"]
    return report


def run_rpc(args, serve_args: list[str]) -> dict:
    reason = namespace_unavailable()
    if reason:
        return {"skipped": reason}
    try:
        namespace = Namespace()
    except OSError as exc:
        return {"skipped": f"cannot make the network namespace: {exc}"}
    rpc = RpcServer(namespace)
    server = None
    tree: list[int] = []
    try:
        rpc.start()
        # One engine: an rpc-server serves one client at a time (tests/test_rpc.py).
        server = ServerProcess(*serve_args, "-np", "1", "--rpc", rpc.endpoint)
        run = SoakRun(server, args, args.rpc_seconds, 1, rpc=rpc)
        run.soak()
        tree = descendants_of(server.proc.pid)
    finally:
        if server is not None:
            tree = tree or descendants_of(server.proc.pid)
            server.stop()
        rpc.stop()
        namespace.close()
    report = run.report()
    report["namespace"] = {"name": namespace.name, "veth": [namespace.host_if, namespace.ns_if],
                           "host_address": namespace.host_address, "rpc_endpoint": rpc.endpoint,
                           "left_after_cleanup": namespace.leftovers()}
    report["left_after_stop"] = processes_left(tree)
    report["goals"]["no process left behind"] &= not report["left_after_stop"]
    report["goals"]["namespace removed"] = not report["namespace"]["left_after_cleanup"]
    if not any("again" in e["event"] for e in run.rpc_events):
        report["goals"]["rpc-server stopped and started again"] = False
    return report


def processes_left(pids: list[int], wait_s: float = 10) -> list[dict]:
    """Those of `pids` (the server's processes) still running after it stopped."""
    until = time.monotonic() + wait_s
    while True:
        alive = [pid for pid in pids if command_line(pid)]
        if not alive or time.monotonic() > until:
            return [{"pid": pid, "command": command_line(pid)[:80]} for pid in alive]
        time.sleep(0.2)


def print_report(name: str, r: dict) -> None:
    print(f"\n== {name} run ==")
    if "skipped" in r:
        print(f"SKIPPED: {r['skipped']}")
        return
    print(f"model {r['model']} (n_ctx {r['n_ctx']}), {r['engines']} engine(s), {r['clients']} clients, "
          f"{r['seconds']} s")
    req = r["requests"]
    print(f"requests sent: {req['sent']}; served (completed replies): {req['completed']}  "
          + "  ".join(f"{k}: {v}" for k, v in req.items() if k.startswith("completed (")))
    print(f"503s: {r['503']}  other 5xx: {r['other_5xx']}  good requests not served, by status and code: "
          f"{req['statuses']}")
    print(f"streams cut by an error event: {req['streams_cut']}")
    rep = r["replies"]
    print(f"replies compared with the quiet server's: {rep['compared']}, differing: {rep['differing']}; "
          f"served after the first engine kill: {rep['served_after_first_kill']}"
          + (f"; after the rpc-server's restart: {rep['served_after_rpc_restart']}"
             if rep["served_after_rpc_restart"] is not None else ""))
    for d in rep["first_differences"]:
        print(f"  DIFFERS {d['request']} (stream={d['stream']}):\n    got      {d['reply']!r}\n"
              f"    expected {d['reference']!r}")
    print(f"bad requests: {r['bad_requests']}")
    print(f"leaving client: {r['disconnects']}")
    kills = r["faults"]["engine_kills"]
    print(f"engine kills: {len([k for k in kills if k.get('pid')])} at "
          + ", ".join(f"{k['t']} s" for k in kills if k.get("pid")))
    for e in r["faults"]["rpc"]:
        print(f"rpc: {e['t']} s {e['event']}")
    print(f"\n| pid | process | from | to | start MiB | end MiB | max MiB | flat |   (start: first sample at "
          f"{WARM_AGE_S} s of age or more; flat: end within max(+{FLAT_RATIO:.0%}, +{FLAT_SLACK_KIB // 1024} MiB))")
    print("|---|---|---|---|---|---|---|---|")
    for m in r["memory"]:
        role = m["role"] + (" (killed)" if m["killed"] else "")
        flat = {True: "yes", False: "NO", None: "-"}[m["flat"]]
        print(f"| {m['pid']} | {role} | {m['first_s']} s | {m['last_s']} s | {m['start_kib'] / 1024:.1f} | "
              f"{m['end_kib'] / 1024:.1f} | {m['max_kib'] / 1024:.1f} | {flat} |")
    print("\n| /metrics | clients | /metrics | match |")
    print("|---|---|---|---|")
    for c in r["metrics"]:
        print(f"| {c['metric']} | {c['clients']} | {c['metrics']} | {'yes' if c['match'] else 'NO'} |")
    if r["left_behind"] or r.get("left_after_stop"):
        print(f"processes left behind: {r['left_behind']} {r.get('left_after_stop')}")
    if r["failures"]:
        print(f"failures ({r['failure_count']}, first ones):")
        for f in r["failures"][:10]:
            print(f"  {f}")
    print("goals: " + ", ".join(f"{k}: {'met' if v else 'MISSED'}" for k, v in r["goals"].items()))


def parse_args(argv: list[str]):
    serve_args = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=600, help="Length of the run on local engines.")
    parser.add_argument("--clients", type=int, default=8, help="Streaming clients, besides the leaving one "
                                                               "and the one sending bad requests.")
    parser.add_argument("--engines", type=int, default=2, help="Engine processes of the local run (-np).")
    parser.add_argument("--kill-every", type=float, default=60, help="SIGKILL an engine process this often "
                                                                     "(seconds; 0: never).")
    parser.add_argument("--disconnect-every", type=float, default=3, help="A client leaves mid-stream this often.")
    parser.add_argument("--bad-every", type=float, default=1, help="A bad request this often.")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-requests", type=int, default=200_000, help="Most requests in a run, all clients.")
    parser.add_argument("--sample-every", type=float, default=10, help="Memory samples this often (seconds).")
    parser.add_argument("--rpc", choices=("on", "off", "only"), default="on",
                        help="The run with the target on an rpc-server in a network namespace.")
    parser.add_argument("--rpc-seconds", type=float, default=180, help="Length of the rpc run.")
    parser.add_argument("--rpc-stop-at", type=float, default=0.45,
                        help="When the rpc-server is killed, as a share of the rpc run.")
    parser.add_argument("--rpc-outage", type=float, default=15, help="Seconds until it starts again.")
    parser.add_argument("--out", help="Write the whole report here (JSON).")
    args = parser.parse_args(own)
    return args, serve_args


def _interrupt(*_) -> None:
    """A SIGTERM ends the run as Ctrl-C does: through the finally blocks that stop every child."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args, serve_args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    report = {"command": shlex.join([sys.executable, sys.argv[0], *argv]),
              "date": time.strftime("%Y-%m-%d %H:%M:%S"), "serve_args": serve_args, "options": vars(args),
              "runs": {}}
    try:
        if args.rpc != "only":
            report["runs"]["local"] = run_local(args, serve_args)
            print_report("local", report["runs"]["local"])
        if args.rpc != "off":
            report["runs"]["rpc"] = run_rpc(args, serve_args)
            print_report("rpc", report["runs"]["rpc"])
    except KeyboardInterrupt:
        print("interrupted; the server, the rpc-server and the namespace are gone", file=sys.stderr)
        return 130
    missed = [f"{name}: {goal}" for name, run in report["runs"].items()
              for goal, met in run.get("goals", {}).items() if not met]
    report["missed"] = missed
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1, default=str)
    print("\nall goals met" if not missed else "\nMISSED: " + "; ".join(missed))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
