"""`cospec-local arbiter` (train, list, show) and what an arbiter records about its training:
run as a user runs them, on the demo pair."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest

from cospec_local import Engine
from cospec_local.errors import ArbiterSettingsWarning

CLI = [sys.executable, "-m", "cospec_local.cli"]


def run_cli(*args, env=None, timeout=1800):
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


# ---------------------------------------------------------------- trained under another block length

def test_another_block_length_warns_once():
    with Engine("demo-target", "demo-draft", n_ctx=512, n_threads=1) as engine:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            engine.generate("What is 2 + 2?", arbiter="demo-lora", max_tokens=8)  # trained at 8: quiet
            for _ in range(2):
                engine.generate("What is 2 + 2?", arbiter="demo-lora", draft_max=16, max_tokens=8)
            engine.generate("What is 2 + 2?", arbiter="target", draft_max=16, max_tokens=8)  # nothing learned
        mine = [w for w in caught if issubclass(w.category, ArbiterSettingsWarning)]
        assert len(mine) == 1
        assert "blocks of up to 8 draft tokens; with --draft-max 16" in str(mine[0].message)


def test_the_cli_says_it_as_a_note_and_eval_records_it(tmp_path):
    out = run_cli("generate", "-p", "What is 2 + 2?", "--arbiter", "demo-lora", "--draft-max", 16, "-n", 8)
    assert out.returncode == 0, out.stderr
    notes = [line for line in out.stderr.splitlines() if "trained on blocks of up to 8" in line]
    assert len(notes) == 1 and notes[0].startswith("note: arbiter demo-lora") and "Warning" not in out.stderr
    out = run_cli("eval", "--task", "arith", "--limit", 2, "--runs", "sps,cospec:demo-lora", "--draft-max", 16,
                  "--out", tmp_path / "eval", "-t", 1)
    assert out.returncode == 0, out.stderr
    config = json.loads((tmp_path / "eval" / "config.json").read_text())
    assert config["runs"]["cospec:demo-lora"]["arbiter"]["trained_under"]["draft_max"] == "8"
    assert config["runs"]["settings"]["draft_max"] == 16


# ---------------------------------------------------------------- list and show

def test_list_and_show_the_bundled_arbiters(tmp_path):
    env = {"COSPEC_LOCAL_ARBITERS": str(tmp_path / "none-yet")}
    out = run_cli("arbiter", "list", "--json", env=env)
    assert out.returncode == 0, out.stderr
    rows = {r["name"]: r for r in json.loads(out.stdout)}
    assert set(rows) == {"demo-lora", "demo-features"}
    lora = rows["demo-lora"]
    assert lora["where"] == "bundled" and lora["kind"] == "lora" and lora["draft_file"] == "demo-draft-q8_0.gguf"
    assert lora["trained_under"]["draft_max"] == 8 and 0.5 < lora["threshold"] < 0.6
    assert {"arbiter.gguf", "adapter.gguf", "head.onnx"} <= set(lora["files"])
    out = run_cli("arbiter", "show", "demo-features", env=env)
    assert out.returncode == 0, out.stderr
    assert "demo-features (bundled, features)" in out.stdout and "blocks of up to 8 tokens" in out.stdout
    out = run_cli("arbiter", "show", "nonsense", env=env)
    assert out.returncode == 1 and "no arbiter 'nonsense'" in out.stderr and "demo-lora" in out.stderr
