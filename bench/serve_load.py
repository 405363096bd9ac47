"""Requests/s and time to first token of `cospec-local serve` at several numbers of concurrent
streaming clients.

    .venv/bin/python bench/serve_load.py --clients 1,4,16 --seconds 20 -- -np 1
    .venv/bin/python bench/serve_load.py --clients 1,4,16 -- -m smollm2-135m -np 2

Everything after `--` goes to `cospec-local serve` (the server runs in its own process, on a free
port). Each client sends streamed chat requests back to back for `--seconds`. A 503 (queue full) is
counted, not retried at once: the client waits the Retry-After the server gave.
`--warmup` seconds of one client (3 by default) come before the levels and are not reported.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time

import httpx

from cospec_local.server.process import ServerProcess

PROMPTS = ["Tom has 5 apples and eats 2. How many are left?", "What is 12 + 30?",
           "Write a Python function that returns the square of x.",
           "Chloe has 7 candles and buys 24 more. How many candles does she have?"]


def one_level(url: str, model: str, clients: int, seconds: float, max_tokens: int) -> dict:
    ttft, latency, tokens, busy, errors = [], [], [], [0], []
    lock = threading.Lock()
    until = time.monotonic() + seconds

    def client(i: int) -> None:
        n = 0
        with httpx.Client(base_url=url, timeout=120) as http:
            while time.monotonic() < until:
                body = {"model": model, "messages": [{"role": "user", "content": PROMPTS[(i + n) % len(PROMPTS)]}],
                        "max_tokens": max_tokens, "temperature": 0, "stream": True,
                        "stream_options": {"include_usage": True}}
                n += 1
                t0 = time.perf_counter()
                first, used = None, 0
                with http.stream("POST", "/v1/chat/completions", json=body) as r:
                    if r.status_code == 503:
                        with lock:
                            busy[0] += 1
                        time.sleep(float(r.headers.get("retry-after", "1")))
                        continue
                    if r.status_code != 200:
                        with lock:
                            errors.append(r.status_code)
                        continue
                    for line in r.iter_lines():
                        if not line.startswith("data:") or line.endswith("[DONE]"):
                            continue
                        chunk = json.loads(line[5:])
                        if first is None and chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                            first = time.perf_counter()
                        if chunk.get("usage"):
                            used = chunk["usage"]["completion_tokens"]
                done = time.perf_counter()
                with lock:
                    latency.append(done - t0)
                    tokens.append(used)
                    if first is not None:
                        ttft.append(first - t0)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start

    def pct(values, q):
        return round(statistics.quantiles(values, n=100)[q - 1], 4) if len(values) >= 2 else None

    return {"clients": clients, "requests": len(latency), "requests_per_s": round(len(latency) / wall, 2),
            "tokens_per_s": round(sum(tokens) / wall, 1), "ttft_p50_s": pct(ttft, 50), "ttft_p95_s": pct(ttft, 95),
            "latency_p50_s": pct(latency, 50), "busy_503": busy[0], "errors": errors, "wall_s": round(wall, 1)}


def main() -> None:
    argv = sys.argv[1:]
    serve_args = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="1,4,16", help="Comma-separated numbers of concurrent clients.")
    parser.add_argument("--seconds", type=float, default=20, help="Duration of each level.")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--warmup", type=float, default=3, help="Seconds of one client before the levels.")
    args = parser.parse_args(own)
    server = ServerProcess(*serve_args)
    try:
        model = json.loads(server.get("/v1/models")[1])["data"][0]["id"]
        if args.warmup > 0:
            one_level(server.url, model, 1, args.warmup, args.max_tokens)
        rows = [one_level(server.url, model, int(c), args.seconds, args.max_tokens) for c in args.clients.split(",")]
    finally:
        server.stop()
    print(json.dumps({"serve_args": serve_args, "max_tokens": args.max_tokens, "levels": rows}, indent=1))
    print("\n| clients | requests/s | tokens/s | TTFT p50 | TTFT p95 | latency p50 | 503s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['clients']} | {r['requests_per_s']} | {r['tokens_per_s']} | {r['ttft_p50_s']} s | "
              f"{r['ttft_p95_s']} s | {r['latency_p50_s']} s | {r['busy_503']} |")


if __name__ == "__main__":
    main()
