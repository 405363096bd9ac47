"""One way to define an entry point: a config dataclass whose fields carry their help and their
command-line spelling, read by parse_config; a caller that runs the entry point in a process of
its own (a recipe) builds the config and config_args writes its command line."""
from __future__ import annotations

from pathlib import Path

import pytest

from cospec_local.train.collect import CollectConfig
from cospec_local.train.config import config_args, parse_config


def test_config_args_is_the_command_line_parse_config_reads_back():
    config = CollectConfig(out=Path("/tmp/states"), model="smollm2-135m", model_draft="smollm2-135m-draft",
                           families="arith", train=40, dev=0, chat=True, chat_template="chatml", policy="my-arith",
                           workers=1)
    args = config_args(config)
    assert parse_config(CollectConfig, args) == config
    assert "--chat" in args and "--model" in args and "--train" in args
    assert "--threads" not in args  # defaults stay out of the command line


def test_the_model_flags_are_spelled_as_the_cli_and_llama_cpp_spell_them(capsys):
    config = parse_config(CollectConfig, ["--out", "x", "-m", "target.gguf", "-md", "draft.gguf", "--no-chat"])
    assert (config.model, config.model_draft, config.chat, config.out) == ("target.gguf", "draft.gguf", False, Path("x"))
    with pytest.raises(SystemExit):
        parse_config(CollectConfig, ["--help"])
    helped = capsys.readouterr().out
    assert "-m MODEL, --model MODEL" in helped and "-md MODEL_DRAFT, --model-draft MODEL_DRAFT" in helped
    assert "Train-split problems per family." in helped


def test_the_recipes_warmup_and_grpo_configs_round_trip():
    from cospec_local.train.grpo import GRPOConfig
    from cospec_local.train.warmup import WarmupConfig

    grpo = GRPOConfig(init=Path("warm/lora"), out=Path("out"), target="smollm2-135m", draft="smollm2-135m-draft",
                      families="arith", steps=5, dev=10, threads=1, max_tokens=64, seed=3)
    assert parse_config(GRPOConfig, config_args(grpo)) == grpo
    assert parse_config(GRPOConfig, ["-m", "t", "-md", "d"]).target == "t"
    warmup = WarmupConfig(data="a,b", out=Path("out"), draft="smollm2-135m-draft", arbiters="features", seed=2)
    assert parse_config(WarmupConfig, config_args(warmup)) == warmup


def test_gate_and_bundle_run_from_their_configs(tmp_path):
    """gate.py and bundle.py from their command lines (config dataclasses) on a copy of a shipped
    demo arbiter: a gate is added, and reference generations are recorded that the arbiter replays."""
    import json
    import shutil
    import subprocess
    import sys

    from cospec_local.arbiters import NAMED_ARBITERS
    from cospec_local.train.bundle import BundleConfig
    from cospec_local.train.gate import GateConfig

    folder = tmp_path / "features"
    shutil.copytree(NAMED_ARBITERS["demo-features"].path, folder)
    gate = GateConfig(arbiter=folder, tasks="arith", train=40, dev=20)
    run = subprocess.run([sys.executable, "-m", "cospec_local.train.gate", *config_args(gate)], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0 and "gate of" in run.stdout, run.stderr
    shipped = tmp_path / "shipped"
    bundle = BundleConfig(arbiter=folder, out=shipped, n=2, tasks="arith", max_tokens=64)
    run = subprocess.run([sys.executable, "-m", "cospec_local.train.bundle", *config_args(bundle)], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    rows = [json.loads(line) for line in (shipped / "reference.jsonl").read_text().splitlines()]
    assert [r["family"] for r in rows] == ["arith", "arith"] and (shipped / "arbiter.gguf").is_file()
