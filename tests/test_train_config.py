"""One way to define an entry point: a config dataclass whose fields carry their help and their
command-line spelling, read by parse_config; a caller that runs the entry point in a process of
its own (a recipe) builds the config and config_args writes its command line."""
from __future__ import annotations

from pathlib import Path

import pytest

from cospec_local.train.collect import CollectConfig
from cospec_local.command_line import config_args, parse_config


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


def test_fit_gate_and_ship_arbiter_run_from_their_configs(tmp_path):
    """fit_gate.py and ship_arbiter.py from their command lines (config dataclasses) on a copy of a shipped
    demo arbiter: a gate is added, and reference generations are recorded that the arbiter replays."""
    import json
    import shutil
    import subprocess
    import sys

    from cospec_local.arbiter.catalog import NAMED_ARBITERS
    from cospec_local.train.ship_arbiter import BundleConfig
    from cospec_local.train.fit_gate import GateConfig

    folder = tmp_path / "features"
    shutil.copytree(NAMED_ARBITERS["demo-features"].path, folder)
    gate = GateConfig(arbiter=folder, tasks="arith", train=40, dev=20)
    run = subprocess.run([sys.executable, "-m", "cospec_local.train.fit_gate", *config_args(gate)], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0 and "gate of" in run.stdout, run.stderr
    shipped = tmp_path / "shipped"
    bundle = BundleConfig(arbiter=folder, out=shipped, n=2, tasks="arith", max_tokens=64)
    run = subprocess.run([sys.executable, "-m", "cospec_local.train.ship_arbiter", *config_args(bundle)], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    rows = [json.loads(line) for line in (shipped / "reference.jsonl").read_text().splitlines()]
    assert [r["family"] for r in rows] == ["arith", "arith"] and (shipped / "arbiter.gguf").is_file()


def test_every_recorded_invocation_of_the_demo_pair_recipe_still_parses():
    """The demo pair's config keeps the flags its published invocations used (data/demo/train_log.json
    records each one), and each model's run is built from its own settings."""
    import json

    from cospec_local.models import DEMO_DIR
    from cospec_local.recipes.demo_pair import DRAFT_ARCH, DemoPairConfig

    invocations = json.loads((DEMO_DIR / "train_log.json").read_text())["invocations"]
    assert len(invocations) >= 5
    for invocation in invocations:
        config = parse_config(DemoPairConfig, invocation["argv"])
        assert parse_config(DemoPairConfig, config_args(config)) == config
    first = parse_config(DemoPairConfig, invocations[0]["argv"])
    assert (first.steps_target, first.steps_draft, first.draft_gap) == (2600, 2200, 0.15)
    draft = first.model_run("draft", stop_acc=0.6)
    target = first.model_run("target", stop_acc=first.stop_acc_target)
    assert (draft.seed, draft.steps, draft.mix, draft.lr, draft.arch) == (1, 2200, "arith=0.7,pyfunc=0.3", 2e-3, DRAFT_ARCH)
    assert (target.seed, target.steps, target.stop_acc, target.lr) == (0, 2600, 0.80, 1e-3)
    later = parse_config(DemoPairConfig, ["--out", "o", "--stages", "draft,gguf", "--no-bf16", "--gguf-type", "q8_0"])
    assert (later.bf16, later.stage_list()) == (False, ["draft", "gguf"])
    with pytest.raises(SystemExit):
        parse_config(DemoPairConfig, ["--out", "o", "--gguf-type", "q4_0"])
    with pytest.raises(SystemExit, match="unknown stages: eval"):
        parse_config(DemoPairConfig, ["--out", "o", "--stages", "target,eval"]).stage_list()


@pytest.mark.slow
def test_the_demo_pair_recipe_runs_end_to_end_at_a_tiny_size(tmp_path):
    """Every stage of the recipe on a few hundred problems and a few steps: a tokenizer, both
    models, their GGUF (from a fresh process after training) that the engine loads, and the log."""
    import json
    import subprocess
    import sys

    from cospec_local import Engine

    out = tmp_path / "pair"
    argv = ["--out", str(out), "--steps-target", "3", "--steps-draft", "2", "--eval-points", "1", "--patience", "0",
            "--train-problems", "300", "--tokenizer-problems", "300", "--dev-problems", "4",
            "--gguf-check-problems", "4", "--gguf-type", "f16", "--no-bf16", "--target-arch", "dim=64,layers=1,heads=2,"
            "kv_heads=1,ffn=128", "--draft-arch", "dim=32,layers=1,heads=2,kv_heads=1,ffn=64"]
    done = subprocess.run([sys.executable, "-m", "cospec_local.recipes.demo_pair", *argv], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    log = json.loads((out / "train_log.json").read_text())
    first, child = log["invocations"]  # after training, the GGUF stage ran in a fresh process of its own
    assert first["argv"] == argv and "wall_s" in first
    assert child["argv"][child["argv"].index("--stages") + 1] == "gguf" and "--steps-target" in child["argv"]
    assert (log["runs"]["target"]["planned_steps"], log["runs"]["draft"]["planned_steps"]) == (3, 2)
    assert log["gguf"]["target"]["chosen"] == "f16" and set(log["pair"]) >= {"dev_union", "llama_cpp_speed_ratio"}
    with Engine(out / "demo-target-f16.gguf", out / "demo-draft-f16.gguf", n_ctx=256) as engine:
        assert engine.generate("12 + 30 =", max_tokens=4).stats.predicted_n >= 1


def test_every_entry_point_of_the_package_defines_its_command_one_way():
    """Every `python -m cospec_local...` / `python -m converters...` entry point reads a config
    dataclass through parse_config (`cospec-local` itself, the cli package, is click and has no
    `__main__` guard to find): no other argument
    parser anywhere, and the model flags spelled -m/-md wherever a model is named."""
    import ast
    import dataclasses
    import importlib

    def runs_as_main(path: Path) -> bool:
        return any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in ast.parse(path.read_text()).body)

    repo = Path(__file__).resolve().parents[1]
    entry_points = sorted(p for p in [*(repo / "cospec_local").rglob("*.py"), *(repo / "converters").glob("*.py")]
                          if runs_as_main(p))
    assert len(entry_points) >= 13
    for path in entry_points:
        module = importlib.import_module(".".join(path.relative_to(repo).with_suffix("").parts))
        defined_in = Path(importlib.import_module(module.main.__module__).__file__)  # a converter may reuse a main
        assert "parse_config(" in defined_in.read_text(), path
    parsers = [p for p in [*(repo / "cospec_local").rglob("*.py"), *(repo / "converters").glob("*.py")]
               if p.name != "command_line.py" and any(isinstance(n, ast.Attribute) and n.attr == "ArgumentParser"
                                                      for n in ast.walk(ast.parse(p.read_text())))]
    assert parsers == []
    n_configs = 0
    for path in entry_points:
        module = importlib.import_module(".".join(path.relative_to(repo).with_suffix("").parts))
        configs = [v for v in vars(module).values() if dataclasses.is_dataclass(v) and isinstance(v, type)
                   and v.__module__ == module.__name__ and all("help" in f.metadata for f in dataclasses.fields(v))]
        n_configs += len(configs)
        for config in configs:
            with pytest.raises(SystemExit) as done:  # every field is one parse_config can read
                parse_config(config, ["--help"])
            assert done.value.code == 0, (path, config)
            for f in dataclasses.fields(config):
                if f.name in ("model", "model_draft"):
                    assert f.metadata["flags"] == {"model": ("-m", "--model"),
                                                   "model_draft": ("-md", "--model-draft")}[f.name], (path, f.name)
    assert n_configs >= 12  # every entry point's own config (llama_to_gguf's is its converter's)
