"""The target on a llama.cpp RPC server (`cospec-local rpc-server` on 127.0.0.1): the same greedy
tokens as the local run, clear errors when the server is not there, and a server (`serve`) that
outlives an RPC server dying mid-generation."""
from __future__ import annotations

import json
import subprocess

import httpx
import pytest

from cospec_local import Engine, InvalidArgumentError, ModelLoadError
from cospec_local.server.process import CLI, ServerProcess, start_rpc_server


@pytest.fixture(scope="module")
def rpc_server():
    proc, endpoint = start_rpc_server()
    yield endpoint
    proc.kill()
    proc.wait()


@pytest.mark.slow
def test_greedy_output_through_the_rpc_server_equals_the_local_run(target_path, draft_paths, rpc_server):
    prompt = "The three primary colors are"
    with Engine(target_path, draft_paths["mixed"], n_ctx=512, n_threads=1) as local:
        expected = {mode: local.generate(prompt, max_tokens=40, mode=mode).tokens
                    for mode in ("target-only", "speculative")}
    with Engine(target_path, draft_paths["mixed"], n_ctx=512, n_threads=1, rpc=rpc_server) as remote:
        for mode, tokens in expected.items():
            result = remote.generate(prompt, max_tokens=40, mode=mode)
            assert result.tokens == tokens, mode
        assert remote.score([1, 2, 3]).shape[0] == 3
    # The command line's --rpc reaches the same engine.
    out = subprocess.run([*CLI, "generate", "-m", target_path, "-md", draft_paths["mixed"], "--rpc", rpc_server,
                          "-t", "1", "-c", "512", "-n", "40", "-p", prompt, "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["tokens"] == expected["speculative"]


@pytest.mark.slow
def test_one_server_serves_engines_of_one_process_not_of_two(target_path, rpc_server):
    """llama.cpp keeps one connection per server in a process, and an rpc-server serves one client
    at a time: a second engine here shares the connection; one in another process (`serve -np 2`)
    is refused with the reason, after the handshake's 5 s, instead of waiting for ever."""
    with Engine(target_path, n_ctx=256, n_threads=1, rpc=rpc_server) as first, \
            Engine(target_path, n_ctx=256, n_threads=1, rpc=rpc_server) as second:
        assert first.generate("Hi", max_tokens=4, mode="target-only").tokens == \
            second.generate("Hi", max_tokens=4, mode="target-only").tokens
    with pytest.raises(RuntimeError, match="one client at a time"):
        ServerProcess("-m", target_path, "--mode", "target-only", "-c", "256", "-np", "2", "--rpc", rpc_server)


def test_a_server_that_is_not_there_is_a_clear_error(target_path):
    with pytest.raises(ModelLoadError, match="cannot reach the RPC server at 127.0.0.1:1"):
        Engine(target_path, n_ctx=256, n_threads=1, rpc="127.0.0.1:1")
    with pytest.raises(InvalidArgumentError, match="expected HOST:PORT"):
        Engine(target_path, n_ctx=256, n_threads=1, rpc="localhost")
    out = subprocess.run([*CLI, "generate", "-m", target_path, "--rpc", "127.0.0.1:1", "-p", "hi", "-n", "4"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "cannot reach the RPC server" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.slow
def test_serve_survives_an_rpc_server_dying_mid_generation(target_path):
    """llama.cpp's RPC client aborts its process when the server goes away mid-generation; `serve`
    runs each engine in a process of its own, so the request gets an error, the server lives on,
    and the engine starts again once the RPC server is back."""
    rpc, endpoint = start_rpc_server()
    port = int(endpoint.rsplit(":", 1)[1])
    srv = ServerProcess("-m", target_path, "-a", "smollm2", "--mode", "target-only", "-c", "2048", "--rpc", endpoint)
    body = {"model": "smollm2", "prompt": "Once upon a time", "max_tokens": 1500, "ignore_eos": True}
    try:
        with httpx.Client(base_url=srv.url, timeout=60) as http:
            with http.stream("POST", "/v1/completions", json=dict(body, stream=True)) as r:
                lines = r.iter_lines()
                data = [line for line, _ in zip(lines, range(20)) if line.startswith("data:")]
                rpc.kill()
                rpc.wait()
                data += [line for line in lines if line.startswith("data:")]
            error = json.loads(data[-1][5:])["error"]
            assert error["code"] == "engine_died" and "engine process ended" in error["message"], data[-1]
            assert json.loads(srv.get("/health")[1])["status"] == "ok"
            down = http.post("/v1/completions", json=dict(body, max_tokens=4))
            assert down.status_code == 503 and down.json()["error"]["code"] == "engine_unavailable"
            assert "cannot reach the RPC server" in down.json()["error"]["message"]
            rpc, _ = start_rpc_server(port)
            back = http.post("/v1/completions", json=dict(body, max_tokens=4))
            assert back.status_code == 200 and back.json()["usage"]["completion_tokens"] == 4
    finally:
        srv.stop()
        rpc.kill()
        rpc.wait()
