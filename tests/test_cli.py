"""The `cospec-local` command line, run as a user runs it."""
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pexpect
import pytest

CLI = [sys.executable, "-m", "cospec_local.cli"]


def run_cli(*args, timeout=900, **kw):
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout, **kw)


def test_generate_json(target_path, draft_paths):
    out = run_cli("generate", "-m", target_path, "-md", draft_paths["disagreeing"], "-p", "The capital of France is",
                  "-n", 12, "--mode", "speculative", "--draft-max", 3, "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert set(data) >= {"text", "tokens", "provenance", "decisions", "stats"}
    assert data["mode"] == "speculative" and data["arbiter"] == "target"
    assert len(data["tokens"]) == len(data["provenance"]) == data["stats"]["predicted_n"]
    stats = data["stats"]
    for key in ("prompt_n", "prompt_per_second", "predicted_n", "predicted_per_second", "draft_n", "draft_n_accepted",
                "blocks", "arbiter_keeps", "target_fallbacks", "bonus", "arbiter_calls", "arbiter_ms"):
        assert key in stats
    assert stats["draft_n_accepted"] + stats["target_fallbacks"] + stats["bonus"] + stats["plain"] == stats["predicted_n"]


def test_generate_reports_bad_model_without_traceback(target_path, tmp_path):
    out = run_cli("generate", "-m", target_path, "-md", tmp_path / "missing.gguf", "-p", "Hi", "-n", 4)
    assert out.returncode != 0
    assert "file not found" in out.stderr and "Traceback" not in out.stderr


def test_bench_json(target_path, draft_paths, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The capital of France is\nWrite a poem about rain.\n")
    out = run_cli("bench", "-m", target_path, "-md", draft_paths["disagreeing"], "--prompts", prompts,
                  "--draft-max", "1,3", "-n", 16, "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    rows = report["results"]
    assert {(r["draft_max"], r["run"]) for r in rows} == {(k, m) for k in (1, 3) for m in ("target-only", "sps", "fly")}
    for r in rows:
        assert r["tokens"] == 2 * 16
        if r["run"] == "target-only":
            assert r["speedup"] == pytest.approx(1.0) and r["speedup_bound"] is None
        else:
            assert r["speedup"] > 0 and 0 <= r["acceptance_rate"] <= 1
            assert 0 < r["speedup_bound"] < r["draft_max"] + 1
        if r["run"] == "sps":
            assert r["prompts_identical_to_target"] == 2
    assert 0 < report["c"] < 1  # the 2-block draft is cheaper per token than the target


def spawn_chat(target_path, draft_path):
    env = dict(os.environ, TERM="dumb", PYTHONUNBUFFERED="1")
    child = pexpect.spawn(sys.executable, [*CLI[1:], "chat", "-m", str(target_path), "-md", str(draft_path),
                                           "-n", "400", "--temp", "0"], env=env, encoding="utf-8", timeout=120)
    child.expect_exact(">>> ")
    return child


def test_chat_session(target_path, draft_paths):
    child = spawn_chat(target_path, draft_paths["disagreeing"])
    child.sendline("/?")
    child.expect("Commands:")
    child.expect_exact(">>> ")
    child.sendline("/set max-tokens 16")
    child.expect_exact("(max-tokens set)")
    child.sendline("Say hello.")
    child.expect(r"\[\d+ tokens, [\d.]+ tok/s, speculative, arbiter target \| drafted \d+")
    child.expect_exact(">>> ")
    # multi-line input, then a reply
    child.sendline("Name two colours \\")
    child.expect_exact("... ")
    child.sendline("and one animal.")
    child.expect(r"tok/s")
    child.expect_exact(">>> ")
    child.sendline("/clear")
    child.expect_exact("(conversation cleared)")
    child.sendline("/bye")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_chat_ctrl_c_stops_reply_then_exits(target_path, draft_paths):
    child = spawn_chat(target_path, draft_paths["disagreeing"])
    child.sendline("Write a very long story about the sea.")
    child.expect_exact("the sea.\r\n")  # the echoed input
    child.expect(r"\w+ \w+ \w+ \w+")  # the reply is streaming
    child.kill(signal.SIGINT)
    child.expect_exact("[reply stopped]")
    child.expect_exact(">>> ")
    child.sendline("/set max-tokens 8")
    child.sendline("Thanks.")  # the conversation goes on
    child.expect(r"tok/s")
    child.expect_exact(">>> ")
    child.kill(signal.SIGINT)  # at the prompt: leave
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0 or child.signalstatus is None


def test_models_lists_named_models(tmp_path):
    env = dict(os.environ, COSPEC_LOCAL_CACHE=str(tmp_path))
    out = run_cli("models", "--json", env=env)
    assert out.returncode == 0, out.stderr
    rows = {r["name"]: r for r in json.loads(out.stdout)}
    target, truncated = rows["smollm2-135m"], rows["smollm2-135m-first4"]
    assert target["architecture"] == "llama" and target["vocabulary"] == 49152 and target["quantization"] == "Q4_1"
    assert truncated["layers"] == 4 and truncated["vocabulary"] == 49152
    assert Path(truncated["path"]).parent == tmp_path  # derived on first use, into the cache
    distilled = rows["smollm2-135m-draft"]
    assert distilled["layers"] == 2 and distilled["vocabulary"] == 49152 and distilled["quantization"] == "Q8_0"
    demo_target, demo_draft = rows["demo-target"], rows["demo-draft"]
    assert demo_target["architecture"] == demo_draft["architecture"] == "llama"
    assert demo_target["vocabulary"] == demo_draft["vocabulary"] == 512
    assert demo_target["layers"] > demo_draft["layers"]


def test_chat_with_the_learned_arbiter_colours_kept_tokens():
    """`chat --arbiter demo-lora --color` on the demo pair: the arbiter keeps a draft token on this
    problem (found by its recorded decisions), shown in magenta, and the answer stays right."""
    from cospec_local.tasks import load_task

    problem = load_task("arith", "test", 2)[1]
    env = dict(os.environ, TERM="dumb", PYTHONUNBUFFERED="1")
    child = pexpect.spawn(sys.executable, [*CLI[1:], "chat", "--arbiter", "demo-lora", "--color", "-t", "1"], env=env,
                          encoding="utf-8", timeout=120)
    child.expect_exact(">>> ")
    child.sendline(problem.prompt)
    child.expect(r"arbiter demo-lora \| drafted \d+, accepted \d+ \(\d+%\), arbiter keeps [1-9]")
    reply = child.before
    assert "\x1b[35;1m" in reply  # a kept draft token
    assert f"#### {problem.answer}" in re.sub(r"\x1b\[[0-9;]*m", "", reply)
    child.expect_exact(">>> ")
    child.sendline("/bye")
    child.expect(pexpect.EOF)
