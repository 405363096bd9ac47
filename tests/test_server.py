"""`cospec-local serve` as clients meet it: the official openai client and raw HTTP against a live
server process on the demo pair (and on SmolLM2 where a generation must run long)."""
from __future__ import annotations

import concurrent.futures
import json
import os
import re
import signal
import threading
import time

import httpx
import openai
import pytest

from cospec_local import Engine
from cospec_local.chat.display import DRAFT_OFF_SHARE
from cospec_local.server.process import ServerProcess

CHLOE = "Chloe has 7 candles and buys 24 more. How many candles does she have?"
GREEDY = {"temperature": 0, "extra_body": {"repeat_penalty": 1.0}}
PROVENANCES = {"match", "ngram", "kept", "fallback", "bonus", "target", "draft", "text"}


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("-c", "512", "-np", "2", "--queue", "8")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def long_server(target_path, draft_paths):
    """SmolLM2 with --queue 0: a generation that ignores EOS runs for many seconds, and a second
    request finds the only engine busy and no room to wait."""
    srv = ServerProcess("-m", target_path, "-md", draft_paths["disagreeing"], "-a", "smollm2", "-c", "2048",
                        "--queue", "0")
    yield srv
    srv.stop()


def chat(client, content, **kw):
    return client.chat.completions.create(model="demo-target", messages=[{"role": "user", "content": content}], **kw)


def metric(server, name: str) -> float:
    _, text = server.get("/metrics")
    found = re.search(rf"^{name} (\S+)$", text.decode(), re.M)
    assert found, f"{name} missing from /metrics"
    return float(found.group(1))


# ---------------------------------------------------------------- the API through the openai client

@pytest.mark.slow
def test_chat_completion_equals_the_engine_in_process(client):
    for arbiter in ("target", "demo-lora"):
        reply = chat(client, CHLOE, max_tokens=96, temperature=0, extra_body={"repeat_penalty": 1.0, "arbiter": arbiter})
        with Engine("demo-target", "demo-draft", n_ctx=512, n_threads=1) as engine:
            local = engine.create_chat_completion([{"role": "user", "content": CHLOE}], max_tokens=96, temperature=0,
                                                  repeat_penalty=1.0, arbiter=arbiter)
        assert reply.choices[0].message.content == local["choices"][0]["message"]["content"] != ""
        assert reply.choices[0].finish_reason == local["choices"][0]["finish_reason"]
        assert reply.usage.completion_tokens == local["usage"]["completion_tokens"]
        extra = reply.model_extra
        assert extra["cospec"]["arbiter"] == arbiter and extra["cospec"]["mode"] == "speculative"
        assert extra["timings"]["predicted_n"] == reply.usage.completion_tokens
        assert extra["timings"]["draft_n"] > 0


def test_stream_carries_the_same_tokens_as_the_whole_answer(client):
    settings = dict(max_tokens=80, temperature=0.8, seed=11)
    whole = chat(client, CHLOE, **settings).choices[0].message.content
    stream = chat(client, CHLOE, stream=True, stream_options={"include_usage": True}, **settings)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole != ""
    assert chunks[0].choices[0].delta.role == "assistant"
    last = [c for c in chunks if c.choices][-1]
    assert last.choices[0].finish_reason in ("stop", "length")
    assert last.model_extra["timings"]["predicted_n"] > 0 and last.model_extra["cospec"]["seed"] == 11
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == last.model_extra["timings"]["predicted_n"]


def test_n_choices_are_independent_samples_each_with_its_own_seed_whole_and_streamed(client):
    # (The demo target is sure of most tokens: at 1.5 and 48 tokens, three seeds part somewhere.)
    settings = dict(max_tokens=48, temperature=1.5, seed=40)
    reply = chat(client, CHLOE, n=3, **settings)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    texts = [c.message.content for c in reply.choices]
    singles = [chat(client, CHLOE, **{**settings, "seed": 40 + i}) for i in range(3)]
    assert [one.choices[0].message.content for one in singles] == texts  # choice i is the request with seed + i
    assert len(set(texts)) > 1  # sampled at temperature 1: the choices differ
    assert [c["seed"] for c in reply.model_extra["cospec"]["choices"]] == [40, 41, 42]
    assert reply.usage.completion_tokens == sum(one.usage.completion_tokens for one in singles)
    assert reply.usage.prompt_tokens == singles[0].usage.prompt_tokens  # the prompt counted once
    streamed: dict[int, str] = {}
    chunks = list(chat(client, CHLOE, n=3, stream=True, stream_options={"include_usage": True}, **settings))
    for c in chunks:
        for choice in c.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + (choice.delta.content or "")
    assert [streamed[i] for i in range(3)] == texts
    assert chunks[-1].usage.completion_tokens == reply.usage.completion_tokens


def test_a_request_without_seed_gets_one_and_it_reproduces(client):
    first = chat(client, CHLOE, max_tokens=40, temperature=1.0)
    seed = first.model_extra["cospec"]["seed"]
    again = chat(client, CHLOE, max_tokens=40, temperature=1.0, seed=seed)
    assert again.choices[0].message.content == first.choices[0].message.content


def test_per_token_provenance_adds_up_to_the_text(client):
    # Sampled with a seed, so that the whole reply and the streamed one draft the same blocks: the
    # arbiter's gate abstains on this prompt, and a greedy call's block lengths then follow timings.
    reply = chat(client, CHLOE, max_tokens=96, extra_body={"provenance": True, "repeat_penalty": 1.0,
                                                           "arbiter": "demo-lora"}, temperature=0.7, seed=5)
    tokens = reply.model_extra["cospec"]["tokens"]
    assert "".join(t["text"] for t in tokens) == reply.choices[0].message.content
    assert len([t for t in tokens if t["id"] >= 0]) == reply.usage.completion_tokens
    assert {t["provenance"] for t in tokens} <= PROVENANCES
    assert sum(t["provenance"] == "kept" for t in tokens) == reply.model_extra["timings"]["arbiter_keeps"]
    # draft_n_matched counts the n-gram drafter's matched tokens too (draft_n_matched_ngram of them)
    assert sum(t["provenance"] in ("match", "ngram") for t in tokens) == reply.model_extra["timings"]["draft_n_matched"]
    assert sum(t["provenance"] == "ngram" for t in tokens) == reply.model_extra["timings"]["draft_n_matched_ngram"]
    stream = chat(client, CHLOE, max_tokens=96, stream=True, temperature=0.7, seed=5,
                  extra_body={"provenance": True, "repeat_penalty": 1.0, "arbiter": "demo-lora"})
    streamed = [t for c in stream for t in (c.model_extra.get("cospec") or {}).get("tokens", [])]
    assert streamed == tokens


def test_mode_and_arbiter_per_request(client):
    target = chat(client, CHLOE, max_tokens=64, extra_body={"mode": "target-only", "repeat_penalty": 1.0}, temperature=0)
    assert target.model_extra["cospec"]["mode"] == "target-only" and target.model_extra["timings"]["draft_n"] == 0
    sps = chat(client, CHLOE, max_tokens=64, extra_body={"arbiter": "target", "repeat_penalty": 1.0}, temperature=0)
    assert sps.choices[0].message.content == target.choices[0].message.content  # lossless
    with pytest.raises(openai.BadRequestError, match="not served here"):
        chat(client, CHLOE, max_tokens=8, extra_body={"arbiter": "/etc"})
    with pytest.raises(openai.BadRequestError):
        chat(client, CHLOE, max_tokens=8, extra_body={"mode": "telepathy"})


def test_text_completions_with_stop_and_token_prompts(client):
    reply = client.completions.create(model="demo-target", prompt=CHLOE + "\n", max_tokens=64, temperature=0,
                                      extra_body={"repeat_penalty": 1.0})
    text = reply.choices[0].text
    assert text and reply.object == "text_completion"
    cut = text.split()[1]
    stopped = client.completions.create(model="demo-target", prompt=CHLOE + "\n", max_tokens=64, temperature=0,
                                        stop=[cut], extra_body={"repeat_penalty": 1.0})
    assert stopped.choices[0].finish_reason == "stop" and cut not in stopped.choices[0].text
    assert text.startswith(stopped.choices[0].text)
    with Engine("demo-target", "demo-draft", n_ctx=512, n_threads=1) as engine:
        ids = engine.tokenize(CHLOE + "\n")
    by_ids = client.completions.create(model="demo-target", prompt=ids, max_tokens=64, temperature=0,
                                       extra_body={"repeat_penalty": 1.0})
    assert by_ids.choices[0].text == text
    streamed = client.completions.create(model="demo-target", prompt=CHLOE + "\n", max_tokens=64, temperature=0,
                                         stream=True, extra_body={"repeat_penalty": 1.0})
    assert "".join(c.choices[0].text for c in streamed if c.choices) == text


def test_models_health_and_metrics(client, server):
    models = client.models.list()
    assert [m.id for m in models.data] == ["demo-target"]
    info = models.data[0].model_extra["cospec"]
    assert info["draft"] == "demo-draft" and "demo-lora" in info["arbiters"]
    assert "smollm2-arith" not in info["arbiters"]  # made for another draft: the web chat does not offer it
    assert "arithmetic word problems" in info["about"]  # the web chat shows the task pair's scope
    status, body = server.get("/health")
    assert status == 200 and json.loads(body)["status"] == "ok"
    before = metric(server, "cospec_completion_tokens_total")
    reply = chat(client, CHLOE, max_tokens=32, temperature=0)
    assert metric(server, "cospec_completion_tokens_total") == before + reply.usage.completion_tokens
    assert metric(server, "cospec_draft_tokens_total") > 0
    assert 0 < metric(server, "cospec_acceptance_ratio") <= 1
    assert metric(server, "cospec_time_to_first_token_seconds_count") > 0
    assert metric(server, 'cospec_requests_total{endpoint="/v1/chat/completions",status="200"}') > 0


# ---------------------------------------------------------------- bad requests

@pytest.mark.slow
def test_bad_requests_get_openai_errors_and_the_server_lives_on(client, server):
    served = client.models.list().data[0].id
    other = client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "What is 2 + 2?"}],
                                           max_tokens=4)  # any name gets the loaded model, as llama-server's
    assert other.model == "gpt-4o" and other.usage.completion_tokens > 0
    reply = httpx.post(server.api + "/chat/completions", timeout=60,  # as curl without "model" sends it
                       json={"messages": [{"role": "user", "content": "What is 2 + 2?"}], "max_tokens": 4})
    assert reply.status_code == 200 and reply.json()["model"] == served
    for bad in ({"max_tokens": -5}, {"max_tokens": 0}, {"temperature": "hot"}, {"top_p": 0}, {"n": 0},
                {"stop": ["a", "b", "c", "d", "e"]}, {"seed": -1}, {"presence_penalty": 0.5}):
        with pytest.raises(openai.BadRequestError) as e:
            chat(client, "hi", **{k: v for k, v in bad.items() if k in ("max_tokens", "n", "stop", "seed",
                                                                          "presence_penalty")},
                 extra_body={k: v for k, v in bad.items() if k in ("temperature", "top_p")})
        assert e.value.status_code == 400 and e.value.body["param"], bad
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, "seven " * 600, max_tokens=8)
    assert e.value.code == "context_length_exceeded"

    raw = [(b"{not json", 400), (b"[1, 2]", 400), (b'{"model": "demo-target"}', 400),
           (b'{"model": "demo-target", "messages": "hi"}', 400),
           (b'{"model": "demo-target", "messages": [{"role": "wizard", "content": "x"}]}', 400),
           (b'{"model": "demo-target", "messages": [{"role": "user", "content": 5}]}', 400),
           (b'{"model": "demo-target", "messages": []}', 400), ("\udcff".encode("utf-8", "surrogatepass"), 400)]
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for body, status in raw:
            r = http.post("/v1/chat/completions", content=body, headers={"Content-Type": "application/json"})
            assert r.status_code == status, body
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        r = http.post("/v1/completions", json={"model": "demo-target", "prompt": [10**9]})
        assert r.status_code == 400 and "vocabulary" in r.json()["error"]["message"]
        r = http.post("/v1/chat/completions", content=b"x" * (9 << 20), headers={"Content-Type": "application/json"})
        assert r.status_code == 413
        # Only JSON: a web page may send text/plain anywhere without asking first.
        r = http.post("/v1/chat/completions", content=b'{"model": "demo-target", "messages": []}',
                      headers={"Content-Type": "text/plain"})
        assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
        # A loopback server answers only to loopback names (DNS rebinding).
        r = http.get("/v1/models", headers={"Host": "attacker.example:8080"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_host"
        # A lone surrogate in a stop string: a 400, and the engine lives on.
        r = http.post("/v1/chat/completions", content=b'{"model": "demo-target", "messages": [{"role": "user", '
                                                      b'"content": "hi"}], "stop": "\\ud800"}',
                      headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["param"].startswith("stop"), r.text
        assert http.get("/v1/chat/completions").status_code == 405
        r = http.get("/v2/nothing")
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    assert server.alive()
    assert chat(client, CHLOE, max_tokens=16).choices[0].message.content  # still serving


@pytest.mark.slow
def test_api_key_and_strict_fields():
    srv = ServerProcess("-c", "512", "--api-key", "s3cret", "--strict")
    try:
        anonymous = openai.OpenAI(base_url=srv.api, api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            chat(anonymous, "hi", max_tokens=4)
        with pytest.raises(openai.AuthenticationError):
            anonymous.models.list()
        with httpx.Client(base_url=srv.url) as http:
            assert http.get("/metrics").status_code == 401
            assert http.get("/health").status_code == 200  # for load balancers, as llama-server's
        keyed = openai.OpenAI(base_url=srv.api, api_key="s3cret", max_retries=0)
        assert chat(keyed, CHLOE, max_tokens=8).usage.completion_tokens > 0
        with pytest.raises(openai.BadRequestError, match="unknown field"):
            chat(keyed, CHLOE, max_tokens=8, extra_body={"temprature": 0.2})
        with pytest.raises(openai.NotFoundError) as e:  # --strict: a name this server does not serve
            keyed.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
        assert e.value.code == "model_not_found"
    finally:
        srv.stop()


# ---------------------------------------------------------------- engines, queue and disconnects

@pytest.mark.slow
def test_a_client_that_disconnects_aborts_its_generation(long_server):
    body = {"model": "smollm2", "prompt": "Once upon a time", "max_tokens": 1500,
            "stream": True, "ignore_eos": True, "mode": "target-only"}
    aborted = metric(long_server, "cospec_generations_aborted_total")
    with httpx.Client(base_url=long_server.url, timeout=60) as http:
        with http.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            got = [line for line, _ in zip(lines, range(12)) if line.startswith("data:")]
            assert got
        stopped = time.monotonic()
        while json.loads(long_server.get("/health")[1])["engines_busy"]:
            assert time.monotonic() - stopped < 5, "the generation went on after its client left"
            time.sleep(0.05)
    assert metric(long_server, "cospec_generations_aborted_total") == aborted + 1
    assert metric(long_server, "cospec_completion_tokens_total") < 1000
    # A client gone before its first token: its stop comes just as the generation starts.
    with httpx.Client(base_url=long_server.url, timeout=60) as http:
        with http.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
        stopped = time.monotonic()
        while json.loads(long_server.get("/health")[1])["engines_busy"]:
            assert time.monotonic() - stopped < 5, "a generation whose client left at once went on"
            time.sleep(0.05)
    assert metric(long_server, "cospec_generations_aborted_total") == aborted + 2


def test_a_full_queue_answers_503_then_serves_again(long_server):
    model = "smollm2"
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": 1500, "stream": True, "ignore_eos": True,
            "mode": "target-only"}
    with httpx.Client(base_url=long_server.url, timeout=60) as http:
        with http.stream("POST", "/v1/completions", json=body) as r:
            lines = r.iter_lines()  # kept: a closed line iterator closes the stream, and the server stops
            next(line for line in lines if line.startswith("data:"))  # the engine is busy now
            busy = http.post("/v1/completions", json={"model": model, "prompt": "Hi", "max_tokens": 4})
            assert busy.status_code == 503
            assert busy.headers["retry-after"] == "1"
            assert busy.json()["error"]["code"] == "server_busy"
        deadline = time.monotonic() + 10
        while True:
            r = http.post("/v1/completions", json={"model": model, "prompt": "Hi", "max_tokens": 4})
            if r.status_code != 503 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] > 0
        # a general model gets no task-pair scope note in the web chat
        assert http.get("/v1/models").json()["data"][0]["cospec"]["about"] is None


def requests_counted(server) -> dict[tuple[str, str], float]:
    """cospec_requests_total by (endpoint, status)."""
    _, text = server.get("/metrics")
    return {(m.group(1), m.group(2)): float(m.group(3)) for m in
            re.finditer(r'^cospec_requests_total\{endpoint="([^"]+)",status="(\d+)"\} (\S+)$', text.decode(), re.M)}


@pytest.mark.slow
def test_an_engine_killed_mid_generation_is_a_503_counted_once(long_server):
    """An engine process that dies mid-request (SIGKILL here; llama.cpp aborts the process when its
    RPC server goes away) starts again for the next request: its request gets 503 engine_died with
    Retry-After (a stream, whose 200 is sent, gets it as its last event), /metrics counts that
    request once, with the status the client saw, and the next request is served."""
    body = {"model": "smollm2", "prompt": "Once upon a time", "max_tokens": 1500, "ignore_eos": True,
            "mode": "target-only"}
    path = "/v1/completions"
    before = requests_counted(long_server)

    def kill_the_engine_once_busy():
        deadline = time.monotonic() + 30
        while not json.loads(long_server.get("/health")[1])["engines_busy"]:
            assert time.monotonic() < deadline, "the request never reached the engine"
            time.sleep(0.05)
        time.sleep(0.5)  # into the generation, which runs for many seconds
        os.kill(long_server.engine_pids()[0], signal.SIGKILL)

    with httpx.Client(base_url=long_server.url, timeout=60) as http, \
            concurrent.futures.ThreadPoolExecutor(1) as pool:
        killing = pool.submit(kill_the_engine_once_busy)
        whole = http.post(path, json=body)
        killing.result()
        assert whole.status_code == 503 and whole.headers["retry-after"] == "1", whole.text
        assert whole.json()["error"]["code"] == "engine_died"
        assert "engine process ended" in whole.json()["error"]["message"]
        with http.stream("POST", path, json=dict(body, stream=True)) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            next(line for line in lines if line.startswith("data:"))
            os.kill(long_server.engine_pids()[0], signal.SIGKILL)
            last = [line for line in lines if line.startswith("data:")][-1]
        assert json.loads(last[5:])["error"]["code"] == "engine_died", last
        again = http.post(path, json=dict(body, max_tokens=4))
        assert again.status_code == 200 and again.json()["usage"]["completion_tokens"] == 4
    after = requests_counted(long_server)
    grew = {key: after[key] - before.get(key, 0) for key in after if key[0] == path}
    assert grew == {(path, "503"): 1, (path, "200"): 2}, grew  # the stream's 200 and the last request's


@pytest.mark.slow
def test_concurrent_streams_under_load_lose_and_duplicate_nothing():
    """Load: 8 streaming clients on 2 engines with 3 waiting places, for half a minute. Each stream
    must equal the prompt's whole greedy answer, or be a clean 503; the server's memory stays flat.
    (bench/serve_soak.py holds it for 10 minutes, with faults.)"""
    server = ServerProcess("-c", "512", "-np", "2", "--queue", "3")
    try:
        _load(server, openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=60))
    finally:
        server.stop()


def _load(server, client):
    prompts = [CHLOE, "What is 12 + 30?", "Tom has 5 apples and eats 2. How many are left?",
               "Write a Python function that returns the square of x."]
    reference = {p: chat(client, p, max_tokens=64, **GREEDY).choices[0].message.content for p in prompts}
    counts = {"ok": 0, "busy": 0}
    lock = threading.Lock()
    failures: list[str] = []

    def one_client(i: int, until: float) -> None:
        own = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=60)
        n = 0
        while time.monotonic() < until:
            prompt = prompts[(i + n) % len(prompts)]
            n += 1
            try:
                stream = chat(own, prompt, max_tokens=64, stream=True, **GREEDY)
                text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            except openai.APIStatusError as exc:
                with lock:
                    if exc.status_code == 503:
                        counts["busy"] += 1
                    else:
                        failures.append(f"{exc.status_code}: {exc}")
                continue
            with lock:
                counts["ok"] += 1
                if text != reference[prompt]:
                    failures.append(f"{prompt!r}: {text!r} != {reference[prompt]!r}")

    warm_until = time.monotonic() + 6
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: one_client(i, warm_until), range(8)))
    rss_before = server.rss_kib()
    until = time.monotonic() + 20
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: one_client(i, until), range(8)))
    rss_after = server.rss_kib()
    print("load:", counts, f"rss {rss_before} -> {rss_after} KiB")
    assert not failures, failures[:3]
    assert counts["ok"] > 50 and counts["busy"] > 0  # 8 clients, 5 places: some are turned away
    assert rss_after - rss_before < 64 * 1024, (rss_before, rss_after)
    assert server.alive()


def test_each_request_gets_one_log_line(server, client):
    """As llama-server and Ollama: client, method, path, status and time, once the reply (a whole
    stream too) has been sent."""
    import re
    import time

    before = len(server.log)
    chat(client, CHLOE, max_tokens=8, **GREEDY)
    list(chat(client, CHLOE, max_tokens=8, stream=True, **GREEDY))
    with pytest.raises(openai.BadRequestError):
        chat(client, CHLOE, max_tokens=8, extra_body={"mode": "telepathy"})
    deadline = time.monotonic() + 10
    pattern = re.compile(r"127\.0\.0\.1 POST /v1/chat/completions (\d{3}) \d+ ms")
    while time.monotonic() < deadline:
        statuses = [m.group(1) for line in server.log[before:] if (m := pattern.search(line))]
        if len(statuses) >= 3:
            break
        time.sleep(0.1)
    assert statuses == ["200", "200", "400"]


@pytest.mark.slow
def test_a_draft_that_rarely_agrees_is_said_once_in_the_log(target_path, draft_paths):
    """As chat and generate say it: the engine's tuner all but stops drafting with this pair, and
    the server's log says so in plain words once, not on every request. The tuner times its first
    blocks (a fresh engine's first reply may draft a third of its tokens, more on a loaded machine),
    so of four replies the later ones are the draft-off ones."""
    note = "the draft agrees with the target too rarely"
    body = {"model": "smollm2", "prompt": "The sea is", "max_tokens": 48, "ignore_eos": True, "spec_type": "draft"}
    srv = ServerProcess("-m", target_path, "-md", draft_paths["disagreeing"], "-a", "smollm2", "-c", "1024")
    try:
        with httpx.Client(base_url=srv.url, timeout=120) as http:
            timings = [http.post("/v1/completions", json=body).json()["timings"] for _ in range(4)]
        drafted_off = [t["draft_n"] < DRAFT_OFF_SHARE * t["predicted_n"] for t in timings]
        assert sum(drafted_off) >= 2, timings
        deadline = time.monotonic() + 10
        while not any(note in line for line in srv.log) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sum(note in line for line in srv.log) == 1
    finally:
        srv.stop()



def test_every_openai_field_is_listed_known_and_treated_as_the_docs_say():
    """docs/serve.md's table of OpenAI's fields is protocol.OPENAI_FIELDS; each is a field of the
    request model (so --strict accepts the ignored ones), and each refused one, set, is a 400
    naming it."""
    import re
    from pathlib import Path

    from cospec_local.server.protocol import (OPENAI_FIELDS, APIError, ChatCompletionRequest, CompletionRequest,
                                              parse_request)

    doc = (Path(__file__).resolve().parents[1] / "docs" / "serve.md").read_text()
    for endpoint, cls, base in (("chat", ChatCompletionRequest, {"messages": [{"role": "user", "content": "hi"}]}),
                                ("completions", CompletionRequest, {"prompt": "hi"})):
        title = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
        section = doc.split(f"| `{title}` field |")[1].split("\n\n")[0]
        listed = dict(re.findall(r"^\| `(\w+)` \| (\w+) \|", section, re.M))
        assert listed == OPENAI_FIELDS[endpoint]
        assert set(listed) <= set(cls.model_fields), set(listed) - set(cls.model_fields)
        asks = {"n": 2, "frequency_penalty": 0.5, "presence_penalty": 0.5, "logprobs": True, "top_logprobs": 3,
                "logit_bias": {"1": 5}, "tools": [{"type": "function", "function": {"name": "f"}}],
                "tool_choice": "required", "functions": [{"name": "f"}], "function_call": {"name": "f"},
                "response_format": {"type": "json_object"}, "modalities": ["text", "audio"], "audio": {"voice": "x"},
                "web_search_options": {}, "best_of": 2, "echo": True, "suffix": "x"}
        for field, status in listed.items():
            if status == "refused":
                with pytest.raises(APIError) as e:
                    parse_request(cls, {**base, field: asks[field]}, strict=False)
                assert e.value.status == 400 and e.value.param == field, field
            elif status == "ignored":
                parse_request(cls, {**base, field: "x" if field != "parallel_tool_calls" else True}, strict=True)
