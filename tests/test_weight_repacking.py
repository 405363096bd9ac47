"""llama.cpp's CPU weight repacking, on by default as in llama.cpp: what each model's process holds
repacked, the flag and parameter that turn it off, AMX's trial in a child process, and the
calibration store keyed by it."""
import platform
from pathlib import Path
import subprocess
import sys

import gguf
import pytest

from cospec_local import Engine, _cospec, _cospec_internals
from cospec_local.models import resolve_model

CLI = [sys.executable, "-m", "cospec_local.cli"]
X86_LINUX = platform.system() == "Linux" and platform.machine() in ("x86_64", "AMD64")
# The kinds llama.cpp's repacking covers on x86 without AMX (ggml-cpu/repack.cpp); Q2_K with AVX-512.
X86_REPACKED = {"Q4_0", "Q4_K", "IQ4_NL", "MXFP4"}
needs_repack = pytest.mark.skipif("CPU_REPACK" not in _cospec.repack_buffer_types(),
                                  reason="this CPU has no repacked kernels")


def repackable_bytes(path) -> int:
    system = _cospec.system_info()
    kinds = X86_REPACKED | ({"Q2_K"} if "AVX512 = 1" in system else set())
    return sum(int(t.n_bytes) for t in gguf.GGUFReader(str(path)).tensors
               if t.tensor_type.name in kinds and len(t.shape) == 2 and t.name != "token_embd.weight")


@needs_repack
def test_repacking_is_on_by_default_and_off_when_asked(monkeypatch):
    from cospec_local.errors import InvalidArgumentError

    monkeypatch.delenv("LLAMA_ARG_REPACK")  # (the suite's plain kernels: conftest.py)
    gemma = resolve_model("gemma3-270m")  # Q4_K_M: its Q4_K tensors have repacked kernels
    with Engine(gemma, n_ctx=256, n_threads=1, calibration=None) as engine:
        repacked = engine.repacked_bytes
        assert repacked["target"] > 0 and repacked["draft"] == 0
        if _cospec.repack_buffer_types() == "CPU_REPACK":  # (AMX, where it runs, takes other types too)
            assert repacked["target"] == repackable_bytes(gemma)
    with Engine(gemma, n_ctx=256, n_threads=1, calibration=None, repack=False) as engine:
        assert engine.repacked_bytes == {"target": 0, "draft": 0}
    # llama.cpp's environment variable, where the call gives neither
    for text, repacked in (("off", False), ("0", False), ("true", True), ("on", True)):
        monkeypatch.setenv("LLAMA_ARG_REPACK", text)
        with Engine(gemma, n_ctx=256, n_threads=1, calibration=None) as engine:
            assert (engine.repacked_bytes["target"] > 0) == repacked, text
    with Engine(gemma, n_ctx=256, n_threads=1, calibration=None, repack=True) as engine:  # the call wins
        assert engine.repacked_bytes["target"] > 0
    monkeypatch.setenv("LLAMA_ARG_REPACK", "sometimes")
    with pytest.raises(InvalidArgumentError, match="LLAMA_ARG_REPACK='sometimes' is not a boolean"):
        Engine(gemma, n_ctx=256, n_threads=1, calibration=None)
    # SmolLM2's Q4_1 has no repacked kernel on x86: nothing is copied.
    if X86_LINUX and "AMX" not in _cospec.repack_buffer_types():
        with Engine("smollm2-135m", "smollm2-135m-draft", n_ctx=256, n_threads=1, calibration=None,
                    repack=True) as engine:
            assert engine.repacked_bytes == {"target": 0, "draft": 0}


@needs_repack
def test_the_flags_reach_llama_cpp():
    import json

    import os

    def log(*flags):
        env = {k: v for k, v in os.environ.items() if k != "LLAMA_ARG_REPACK"}  # llama.cpp's default
        out = subprocess.run([*CLI, "generate", "-m", "gemma3-270m", "-p", "Hi", "-n", "2", "-t", "1", "--verbose",
                              "--json", "--calibration", "none", *flags], capture_output=True, text=True,
                             timeout=300, env=env)
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stderr, json.loads(out.stdout)["models"]["repacked"]

    for on in ((), ("--repack",)):
        text, repacked = log(*on)
        assert "CPU_REPACK model buffer size" in text and repacked["target"] > 0  # (the record says so too)
    for off in ("--no-repack", "-nr"):
        text, repacked = log(off)
        assert "CPU_REPACK" not in text and repacked == {"target": 0, "draft": 0}


@pytest.mark.skipif(not X86_LINUX, reason="AMX's trial is Linux's on x86")
def test_amx_is_tried_in_a_child_and_a_sigill_there_leaves_this_process_running():
    # Without the kernel's permission for tile state, AMX's first instruction raises SIGILL on any
    # x86 CPU (the trap of a CPU that has AMX, #UD on one that has not): the trial's child dies, not us.
    assert "SIGILL" in _cospec_internals.amx_trial(ask_permission=False)
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        has_amx = " amx_tile" in f.read()
    answer = _cospec_internals.amx_trial()
    if has_amx:
        assert answer == "" or "left out" in answer  # a VM may report AMX without running it
    else:
        assert answer == "AMX left out: the kernel does not grant this process AMX's tile state"
    # What llama.cpp loads with here: AMX only where its trial ran.
    kinds = _cospec.repack_buffer_types().split(",")
    assert ("AMX" in kinds) == ("AMX" in _cospec.system_info() and has_amx and answer == "")


@needs_repack
def test_a_calibration_is_stored_under_the_kernels_it_timed():
    gemma = resolve_model("gemma3-270m")
    with Engine(gemma, n_ctx=256, n_threads=1, calibration=None, repack=True) as on, \
            Engine(gemma, n_ctx=256, n_threads=1, calibration=None, repack=False) as off:
        assert on.calibration_machine["repacked"]["target"] == on.repacked_bytes["target"] > 0
        assert "repacked" not in off.calibration_machine
        from cospec_local import calibration

        assert calibration.store_path(on.calibration_pair, on.calibration_machine) != \
            calibration.store_path(off.calibration_pair, off.calibration_machine)


@needs_repack
def test_under_repacked_kernels_speculation_leaves_target_only_only_at_near_ties():
    """Repacked Q4_K products batch by four rows and take single rows apart, so a verify rounds
    otherwise than one-token steps at any block length: the greedy output is the target's under
    the verify's numerics, and where it leaves target-only's, the two tokens were a near tie (within
    half a logit as scored). On plain kernels the same pair is identical up to 8 (test_cross_vocab)."""
    import numpy as np

    prompts = ["The capital of France is", "def add(a, b):\n    return", "List three colors:\n1.",
               "Write a short poem about the sea.", "Explain why the sky is blue in two sentences."]
    gemma, smollm2 = resolve_model("gemma3-270m"), resolve_model("smollm2-135m")
    differing = 0
    with Engine(gemma, smollm2, n_ctx=1024, n_threads=2, chat_template="gemma", calibration=None,
                repack=True) as engine:
        assert engine.repacked_bytes["target"] > 0
        for prompt in prompts:
            tokens = engine.render_chat([{"role": "user", "content": prompt}])
            plain = engine.generate(tokens, mode="target-only", max_tokens=40)
            for k in (1, 4):
                drafted = engine.generate(tokens, spec_type="draft", max_tokens=40, adaptive_draft=False, draft_max=k)
                assert drafted.stats.blocks > 0
                at = next((i for i, (x, y) in enumerate(zip(drafted.tokens, plain.tokens)) if x != y), None)
                if at is None:
                    assert drafted.tokens == plain.tokens
                    continue
                differing += 1
                row = engine.score(tokens + plain.tokens[:at])[-1]
                assert row.max() - row[drafted.tokens[at]] < 0.5 and row.max() - row[plain.tokens[at]] < 0.5, (prompt, k)
                assert len(np.flatnonzero(row > row.max() - 0.5)) >= 2
    assert differing < 2 * len(prompts)  # most replies stay target-only's token for token


def mapped_resident_bytes(path) -> int:
    """This process's resident bytes of its mappings of `path` (/proc/self/smaps)."""
    real, total, inside = str(Path(path).resolve()), 0, False
    with open("/proc/self/smaps", encoding="utf-8", errors="replace") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
                inside = len(head) >= 6 and head[5] == real
            elif inside and line.startswith("Rss:"):
                total += int(head[1]) * 1024
    return total


@needs_repack
@pytest.mark.skipif(not X86_LINUX, reason="smaps and Q4_0's repacked kernels on x86")
def test_a_repacked_model_does_not_keep_its_originals_resident():
    """llama.cpp reads the weights it repacks from the mapped file and leaves those pages mapped: the
    engine drops them after load, so a model is not resident twice (its copy and its originals)."""
    model = resolve_model("smollm2-135m-q4_0")  # Q4_0 blocks (repacked), a Q8_0 embedding and output
    size = model.stat().st_size
    with Engine(model, n_ctx=256, n_threads=1, calibration=None, repack=True) as engine:
        engine.generate("The capital of France is", max_tokens=8)
        repacked = engine.repacked_bytes["target"]
        assert repacked > size // 2
        # what stays is the Q8_0 embedding and output in use (a third of the file), not the originals
        assert mapped_resident_bytes(model) < size * 0.6
    with Engine(model, n_ctx=256, n_threads=1, calibration=None, repack=False) as engine:
        engine.generate("The capital of France is", max_tokens=8)
        assert mapped_resident_bytes(model) > size * 0.9  # every weight runs from the mapping
