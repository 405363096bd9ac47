"""A safe engine lifetime and bounded input: close/reset while generating, Ctrl-C, closed
engines, drafts that lack some of the target's tokens, degenerate temperatures, and CLI values
out of range (refused before any model loads, naming the flag, never a traceback)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import gguf
import numpy as np
import pytest

from cospec_local import Engine, InvalidArgumentError, arbiter_from_function
from cospec_local.formats.gguf_edit import open_gguf, rewrite_gguf
from cospec_local.models import demo_model
from cospec_local.tasks import load_task

CLI = [sys.executable, "-m", "cospec_local.cli"]
LONG = dict(max_tokens=20000, ignore_eos=True)


def start(engine, **kw):
    box = {}

    def run():
        try:
            box["result"] = engine.generate("Write a very long story about the sea.", **{**LONG, **kw})
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["exc"] = exc

    worker = threading.Thread(target=run)
    worker.start()
    time.sleep(0.3)
    return worker, box


@pytest.mark.parametrize("attempt", range(5))
@pytest.mark.slow
def test_close_during_generation_stops_it_and_frees_after(attempt, target_path, draft_paths):
    engine = Engine(target_path, draft_paths["mixed"], n_ctx=4096, n_threads=1)
    worker, box = start(engine, arbiter="fly" if attempt % 2 else "target")
    engine.close()
    worker.join(30)
    assert not worker.is_alive()
    assert box["result"].stop_reason == "aborted"  # (with tokens or, if the close came first, none)
    assert engine.closed
    with pytest.raises(InvalidArgumentError, match="closed"):
        engine.generate("Hi", max_tokens=2)
    with pytest.raises(InvalidArgumentError, match="closed"):
        engine.tokenize("Hi")
    engine.close()  # twice is fine


@pytest.mark.slow
def test_reset_during_generation_stops_it_and_keeps_the_engine(target_path, draft_paths):
    with Engine(target_path, draft_paths["mixed"], n_ctx=4096, n_threads=1) as engine:
        for _ in range(3):
            worker, box = start(engine)
            engine.reset()
            worker.join(30)
            assert box["result"].stop_reason == "aborted"
        prompt = "The capital of France is"
        assert engine.generate(prompt, max_tokens=24).tokens == engine.generate(prompt, max_tokens=24,
                                                                                  mode="target-only").tokens


def test_close_inside_a_callback_is_refused_and_the_engine_survives():
    with Engine.open_default(n_ctx=1024, n_threads=1) as engine:
        def closes(block):
            engine.close()
            return np.zeros(block["n_draft"])

        calls = []
        counter = arbiter_from_function(lambda block: calls.append(1) or np.zeros(block["n_draft"]))
        problem = next(p for p in load_task("arith", "test", 40)
                       if engine.generate(p.prompt, arbiter=counter, max_tokens=120, adaptive_draft=False) and calls)
        with pytest.raises(InvalidArgumentError, match="inside a generation's callback"):
            engine.generate(problem.prompt, arbiter=arbiter_from_function(closes), max_tokens=120, adaptive_draft=False)
        assert not engine.closed
        assert engine.last_result.stop_reason == "error"
        assert engine.generate(problem.prompt, max_tokens=8).tokens


def test_ctrl_c_during_generate_keeps_the_partial_result(target_path, draft_paths):
    with Engine(target_path, draft_paths["mixed"], n_ctx=4096, n_threads=1) as engine:
        timer = threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT))
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            engine.generate("Write a very long story about the sea.", **LONG)
        partial = engine.last_result
        assert partial is not None and partial.stop_reason == "aborted" and partial.tokens
        again = engine.generate("Hi", max_tokens=4, ignore_eos=True)  # no "already running"
        assert len(again.tokens) == 4


def draft_lacking_tokens(tmp_path, n_missing=64):
    """The demo draft with the last n_missing tokens of its vocabulary removed (rows of its
    embedding and output matrices too): a pair llama.cpp accepts (sizes within 128)."""
    reader = open_gguf(demo_model("draft"))
    n = len(reader.get_field(gguf.Keys.Tokenizer.LIST).data) - n_missing
    per_token = (gguf.Keys.Tokenizer.LIST, gguf.Keys.Tokenizer.SCORES, gguf.Keys.Tokenizer.TOKEN_TYPE)
    rows = {t.name: t for t in reader.tensors if t.name in ("token_embd.weight", "output.weight")}
    return rewrite_gguf(reader, tmp_path / "draft-short.gguf",
                        kv_edit=lambda key, value: list(value)[:n] if key in per_token else value,
                        keep_tensor=lambda name: name not in rows,
                        add_tensors=[(name, np.ascontiguousarray(t.data[:n]), t.tensor_type) for name, t in rows.items()])


def test_a_draft_lacking_target_tokens_falls_back_to_target_steps(tmp_path):
    short = draft_lacking_tokens(tmp_path)
    with Engine(demo_model("target"), short, n_ctx=1024, n_threads=1) as engine:
        n_draft = 512 - 64
        for problem in load_task("arith", "test", 6):
            tokens = engine.tokenize(problem.prompt)
            # the case this test is about: every task prompt holds tokens the short draft lacks
            assert any(t >= n_draft for t in tokens), problem.id
            target = engine.generate(tokens, mode="target-only", max_tokens=120)
            for arbiter in ("target", "fly"):
                spec = engine.generate(tokens, arbiter=arbiter, spec_type="draft", max_tokens=120)
                if arbiter == "target":
                    assert spec.tokens == target.tokens  # lossless, whatever the draft lacks
                assert spec.stop_reason in ("eog", "max_tokens")
                assert spec.stats.blocks == 0, arbiter  # the draft never sees a token it lacks
            # the same pair drafts on the part of the prompt it can read: no drafting above is the fallback
            readable = tokens[:next(i for i, t in enumerate(tokens) if t >= n_draft)]
            assert len(readable) >= 2
            drafted = engine.generate(readable, max_tokens=8, adaptive_draft=False, spec_type="draft")
            assert drafted.stats.blocks > 0 and drafted.stats.draft_n > 0, problem.id
        with pytest.raises(InvalidArgumentError, match="outside the draft's vocabulary"):
            engine.generate([1, 500, 3], mode="draft-only", max_tokens=2)


def test_temperature_below_float_precision_is_greedy():
    with Engine.open_default(n_ctx=1024, n_threads=1) as engine:
        prompt = load_task("arith", "test", 1)[0].prompt
        greedy = engine.generate(prompt, max_tokens=60, mode="target-only")
        for t in (1e-40, 1e-30, 1e-7):
            tiny = engine.generate(prompt, max_tokens=60, mode="target-only", temperature=t, seed=3)
            assert tiny.tokens == greedy.tokens, t


@pytest.mark.parametrize("args, flag", [
    (["-s", "-1"], "-s/--seed"), (["-s", str(2**64)], "-s/--seed"), (["-n", str(2**31)], "-n/--n-predict"),
    (["--draft-max", str(2**31)], "--draft-max"), (["--top-k", str(2**31)], "--top-k"),
    (["--fly-window", "0"], "--fly-window"), (["--fly-entropy", "nan"], "--fly-entropy"), (["-t", "2000"], "-t/--threads"),
    (["--temp", "nan"], "--temp"), (["--top-p", "0"], "--top-p"), (["--arbiter-threshold", "1.5"], "--arbiter-threshold"),
])
def test_cli_refuses_out_of_range_values_before_loading(args, flag, tmp_path):
    t0 = time.time()
    out = subprocess.run([*CLI, "generate", "-m", tmp_path / "never-loaded.gguf", "-p", "Hi", *args],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert all(f"'{part}'" in out.stderr for part in flag.split("/")), out.stderr  # click names the flag
    assert "Traceback" not in out.stderr and "file not found" not in out.stderr
    assert time.time() - t0 < 60


@pytest.mark.slow
def test_cli_json_interrupt_prints_the_partial_result():
    child = subprocess.Popen([*CLI, "generate", "-m", "smollm2-135m", "-md", "smollm2-135m-draft", "-p",
                              "Write a very long story about the sea.", "-n", "3000", "--ignore-eos", "--json", "-t", "1",
                              "--calibration", "none"],  # (measuring one first would take the interrupt)
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    time.sleep(4)
    child.send_signal(signal.SIGINT)
    time.sleep(0.2)
    child.send_signal(signal.SIGINT)  # a second Ctrl-C behaves like the first
    out, err = child.communicate(timeout=60)
    assert child.returncode == 130, err
    import json

    partial = json.loads(out)
    assert partial["stop_reason"] == "aborted" and partial["tokens"]
    assert "Traceback" not in err and "Aborted!" not in err


def test_cli_interrupt_while_loading_exits_130():
    # SmolLM2 and its draft take a moment to load: the interrupt comes as soon as the CLI names
    # the files it is about to load.
    child = subprocess.Popen([*CLI, "generate", "-m", "smollm2-135m", "-md", "smollm2-135m-draft", "-p", "Hi",
                              "-n", "400", "--ignore-eos"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
    first = child.stderr.readline()
    assert first.startswith("target:"), first
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=60)
    err = first + err
    assert child.returncode == 130, err
    assert "Traceback" not in err and "Aborted!" not in err


def target_with_template(tmp_path, name, template):
    reader = open_gguf(demo_model("target"))
    return rewrite_gguf(reader, tmp_path / f"{name}.gguf",
                        kv_edit=lambda key, value: template if key == gguf.Keys.Tokenizer.CHAT_TEMPLATE else value)


@pytest.mark.slow
def test_hostile_chat_templates_are_stopped_by_the_renderer_process(tmp_path):
    """A render that would run for minutes or take gigabytes ends within the renderer's limits,
    in its own process: this one's memory does not grow, and the engine goes on."""
    import resource

    hostile = target_with_template(tmp_path, "hostile", "{{ lipsum(10**7) }}")
    with Engine(hostile, demo_model("draft"), n_ctx=512, n_threads=1) as engine:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.time()
        from cospec_local import ChatTemplateError

        with pytest.raises(ChatTemplateError, match="time limit|memory|limits"):
            engine.render_chat([{"role": "user", "content": "Hi"}])
        assert time.time() - t0 < 15
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100_000  # KiB
        assert engine.generate("Hi", max_tokens=3, ignore_eos=True).tokens
    out = subprocess.run([*CLI, "generate", "-m", hostile, "--chat", "-p", "Hi", "-n", "4"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 1 and "chat template" in out.stderr and "Traceback" not in out.stderr


def test_a_template_that_does_not_compile_falls_back_to_chatml_and_says_so(tmp_path):
    broken = target_with_template(tmp_path, "broken", "{% for m in messages %}{{ m.content }")
    out = subprocess.run([*CLI, "generate", "-m", broken, "--chat", "-p", "Hi", "-n", "4", "--mode", "target-only"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("chat template cannot be used") == 1 and "using ChatML" in out.stderr


def test_a_draft_that_differs_only_in_add_eos_is_refused_with_that_reason(tmp_path):
    from cospec_local import VocabMismatchError

    reader = open_gguf(demo_model("draft"))
    flipped = rewrite_gguf(reader, tmp_path / "draft-add-eos.gguf",
                           lambda key, value: (not value) if key == gguf.Keys.Tokenizer.ADD_EOS else value)
    with pytest.raises(VocabMismatchError, match="appends EOS"):
        Engine(demo_model("target"), flipped, n_ctx=256)
