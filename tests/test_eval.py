"""`cospec-local eval` end to end through the real engine: its numbers are
consistent and an interrupted run resumes."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cospec_local import Engine, GenerationParams
from cospec_local.evaluation.task_eval import evaluate
from cospec_local.evaluation.runs import parse_runs
from cospec_local.tasks import load_task, score

MODES = ["target-only", "draft-only", "sps", "fly"]


def check_consistent(summary, n_problems):
    modes = summary["runs"]
    assert summary["problems"] == n_problems
    for name, m in modes.items():
        assert m["n"] == n_problems and 0.0 <= m["accuracy"] <= 1.0
        assert m["recovered"] <= summary["non_nested"]
        assert m["losses"] <= round(modes["target-only"]["accuracy"] * n_problems)
    union = summary["oracle_union"]
    assert union >= modes["target-only"]["accuracy"] and union >= modes["draft-only"]["accuracy"]
    assert union <= modes["target-only"]["accuracy"] + modes["draft-only"]["accuracy"] + 1e-9
    assert modes["target-only"]["speedup"] == pytest.approx(1.0)
    # greedy sps is the target: same answers, nothing lost
    assert modes["sps"]["accuracy"] == modes["target-only"]["accuracy"] and modes["sps"]["losses"] == 0


@pytest.mark.slow
def test_eval_summary_is_consistent(engine):
    problems = load_task("arith", "test", limit=3) + load_task("pyfunc", "test", limit=2)
    summary = evaluate(engine, problems, parse_runs(",".join(MODES)), score, params=GenerationParams(max_tokens=48),
                       as_chat=True)
    check_consistent(summary, 5)


@pytest.mark.slow
def test_eval_cli_writes_results_and_resumes(target_path, draft_paths, tmp_path):
    out = tmp_path / "run"
    draft = shutil.copyfile(draft_paths["disagreeing"], tmp_path / "draft.gguf")
    cmd = [sys.executable, "-m", "cospec_local.cli", "eval", "-m", str(target_path), "-md",
           str(draft), "--task", "listops", "--limit", "3", "-n", "32", "--chat",
           "--runs", ",".join(MODES), "--out", str(out), "--json"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stderr
    summary = json.loads(first.stdout)
    check_consistent(summary, 3)
    for name in ("results.json", "results.md", "accuracy_vs_speedup.png", "records.jsonl"):
        assert (out / name).is_file()
    assert (out / "accuracy_vs_speedup.png").read_bytes()[:4] == b"\x89PNG"
    assert str(out / "accuracy_vs_speedup.png") in summary["written"]
    assert summary["models"] == {"target": Path(target_path).name, "draft": "draft.gguf"}
    assert 0 <= summary["other_load"] <= 1  # what else used the machine meanwhile, recorded beside the speeds
    # Every problem runs every run back to back, starting one run later than the problem before.
    order = [json.loads(line)["run"] for line in (out / "records.jsonl").read_text().splitlines()]
    assert order == [m for i in range(3) for m in MODES[i:] + MODES[:i]]
    for m in summary["runs"].values():
        lo, hi = m["accuracy_ci95"]
        assert lo <= m["accuracy"] <= hi and hi - lo > 0.3  # 3 problems say little, and the interval shows it
    plain = subprocess.run([c for c in cmd if c != "--json"], capture_output=True, text=True, timeout=900)
    assert plain.returncode == 0 and f"written: {out / 'records.jsonl'}" in plain.stderr
    assert "(95% CI)" in plain.stdout

    # Drop the last two records as if the run had been interrupted: the rerun redoes only those, here
    # as if on another machine (sessions end): it goes on, and the config names both machines.
    config = json.loads((out / "config.json").read_text())
    here = config["machines"]
    assert len(here) == 1 and "CPU" in here[0]["llama_cpp"] and here[0]["cpu"]
    (out / "config.json").write_text(json.dumps(config | {"machines": [{"cpu": "another CPU"}]}))
    lines = (out / "records.jsonl").read_text().splitlines()
    assert len(lines) == 3 * len(MODES)
    (out / "records.jsonl").write_text("\n".join(lines[:-2]) + "\n")
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr
    lines_after = (out / "records.jsonl").read_text().splitlines()
    assert len(lines_after) == len(lines) and lines_after[:-2] == lines[:-2]
    resumed = json.loads(again.stdout)
    assert resumed["runs"]["target-only"]["accuracy"] == summary["runs"]["target-only"]["accuracy"]
    config = json.loads((out / "config.json").read_text())
    assert config["machines"] == [{"cpu": "another CPU"}, *here]
    assert resumed["machines"] == ["another CPU", here[0]["cpu"]] and 0 <= resumed["other_load"] <= 1
    assert "records from 2 machines" in (out / "results.md").read_text()
    assert config["runs"]["fly"]["mode"] == "speculative" and config["runs"]["fly"]["arbiter"]["name"] == "fly"
    assert config["runs"]["settings"]["fly_window"] == GenerationParams().fly_window

    # Other settings in the same folder are refused rather than mixed in.
    other = subprocess.run([*cmd[:-1], "--json", "--limit", "4"], capture_output=True, text=True, timeout=900)
    assert other.returncode != 0 and "other settings" in other.stderr

    # So is another model written to the same path: its records would mix with the old model's.
    shutil.copyfile(draft_paths["mixed"], draft)
    replaced = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert replaced.returncode != 0 and "other settings" in replaced.stderr


def test_wilson_interval_matches_hand_computed_values():
    from cospec_local.evaluation.task_eval import wilson_interval

    # 14 of 20: p = 0.7, z = 1.96 -> centre 0.6678, half-width 0.1868 (by hand)
    lo, hi = wilson_interval(14, 20)
    assert lo == pytest.approx(0.4810, abs=5e-4) and hi == pytest.approx(0.8545, abs=5e-4)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0
    assert wilson_interval(0, 0) == (0.0, 1.0)
    for n in range(1, 60):  # 0/n and n/n: the interval holds the estimate exactly, whatever the rounding
        assert wilson_interval(0, n)[0] == 0.0 and wilson_interval(n, n)[1] == 1.0
    # 13 of 20 (65%) against 14 of 20 (70%): the intervals overlap almost entirely
    lo13, hi13 = wilson_interval(13, 20)
    assert lo13 < lo < hi13 < hi


def reproducible_part(record: dict) -> dict:
    """Everything but timings; for the lossless run also not its block counts, which follow the
    speed tuner (its text is the target's whatever the blocks were)."""
    timing = {"ms", "arbiter_ms", "other_cpu_ms", "cpu_ms"}  # cpu_ms: the CPUs' time during the generation
    timing |= {"drafted", "accepted", "blocks"} if record["run"] == "sps" else set()
    return {k: v for k, v in record.items() if k not in timing}


@pytest.mark.slow
def test_runs_that_keep_mismatches_are_reproducible(tmp_path):
    """The same eval twice, and resumed after an interruption, gives identical records for runs
    whose arbiter keeps mismatches: no block length or decision depends on timing or on what
    ran before."""
    problems = load_task("arith", "test", limit=13)  # the 13th is the first that demo-lora keeps a token in
    runs = parse_runs("fly,sps,cospec:demo-lora,cospec:demo-features")
    params = GenerationParams(max_tokens=160)
    a, b = tmp_path / "a", tmp_path / "b"
    # Uncalibrated: whether FLy keeps anything here then does not depend on the machine's timings
    # (a calibrated engine's reproducibility is test_calibration's).
    with Engine.open_default(n_threads=1, calibration=None) as engine:
        evaluate(engine, problems, runs, score, a, params)
        # something else runs in between and trains the timing tuner
        engine.generate(problems[0].prompt, max_tokens=40, ignore_eos=True)
        evaluate(engine, problems, runs, score, b, params)
        # as if the second run had been interrupted after five records: resuming redoes the rest
        lines = (b / "records.jsonl").read_text().splitlines()
        (b / "records.jsonl").write_text("\n".join(lines[:5]) + "\n")
        engine.generate(problems[3].prompt, max_tokens=30, ignore_eos=True)
        evaluate(engine, problems, runs, score, b, params)
    first = [reproducible_part(json.loads(line)) for line in (a / "records.jsonl").read_text().splitlines()]
    second = [reproducible_part(json.loads(line)) for line in (b / "records.jsonl").read_text().splitlines()]
    key = lambda r: (r["problem_id"], r["run"])  # noqa: E731
    assert sorted(first, key=key) == sorted(second, key=key)
    for run in ("fly", "cospec:demo-lora", "cospec:demo-features"):
        assert sum(r["kept"] for r in first if r["run"] == run) > 0, f"{run} should keep something on this pair"
    # The config says how the LoRA arbiter's adapter ran (folded or at decode: other rounding).
    config = json.loads((a / "config.json").read_text())["runs"]
    assert config["cospec:demo-lora"]["arbiter"]["adapter_use"] == "folded"
    assert "adapter_use" not in config["cospec:demo-features"]["arbiter"]


def test_a_run_with_the_auto_arbiter_records_the_arbiter_that_ran(target_path):
    from cospec_local.arbiter.catalog import arbiter_identity
    from cospec_local.models import resolve_model

    (run,) = parse_runs("speculative:auto", resolve_model("demo-draft"))
    assert run.arbiter == "demo-lora" and arbiter_identity(run.arbiter)["name"] == "demo-lora"
    (run,) = parse_runs("speculative:auto", target_path)  # no bundled arbiter for this draft: lossless
    assert run.arbiter == "target" and arbiter_identity(run.arbiter) == {"name": "target", "kind": "builtin"}


@pytest.mark.slow
def test_an_arbiter_for_another_draft_fails_before_any_record(target_path, draft_paths, tmp_path):
    """The bundled demo arbiter on SmolLM2's pair is refused up front: no record of the runs
    before it is written, so the folder does not hold a half run under a config nobody can rerun."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "cospec_local.cli", "eval", "-m", str(target_path), "-md",
           str(draft_paths["disagreeing"]), "--task", "arith", "--limit", "2", "-n", "16",
           "--runs", "target-only,sps,cospec:demo-features", "--out", str(out)]
    failed = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert failed.returncode != 0 and "made for another draft model" in failed.stderr
    assert not (out / "records.jsonl").exists() or not (out / "records.jsonl").read_text()
    # The same folder then takes the runs that can run here.
    cmd[cmd.index("--runs") + 1] = "target-only,sps"
    ok = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert ok.returncode == 0, ok.stderr
    assert len((out / "records.jsonl").read_text().splitlines()) == 4


@pytest.mark.slow
def test_an_evaluation_takes_more_runs_and_names_what_differs(tmp_path):
    """More runs of the same evaluation go into its folder beside the earlier ones (which are not
    run again); other settings are refused naming the setting."""
    out = tmp_path / "eval"
    base = [sys.executable, "-m", "cospec_local.cli", "eval", "--task", "arith", "--limit", "3", "-n", "48", "-t", "1",
            "--out", str(out), "--json"]
    first = subprocess.run([*base, "--runs", "target-only,sps"], capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stderr
    records = (out / "records.jsonl").read_text()
    more = subprocess.run([*base, "--runs", "sps,fly"], capture_output=True, text=True, timeout=900)
    assert more.returncode == 0, more.stderr
    assert set(json.loads(more.stdout)["runs"]) == {"target-only", "sps", "fly"}
    assert (out / "records.jsonl").read_text().startswith(records)  # the earlier records kept as they were
    assert len((out / "records.jsonl").read_text().splitlines()) == 9  # sps was not run again
    shorter = [("32" if a == "48" else a) for a in base]
    other = subprocess.run([*shorter, "--runs", "sps"], capture_output=True, text=True, timeout=900)
    assert other.returncode != 0 and "other settings: -n/--n-predict (48 there, 32 here)" in other.stderr


@pytest.mark.slow
def test_the_ngram_run_drafts_from_the_ngram_drafter_alone_and_aasd_is_a_run(tmp_path):
    """`ngram` is sps with the n-gram drafter as its only source (the paper's REST row): the
    target's answers, its source in the config; `aasd` runs AASD's rule under its builtin name."""
    problems = load_task("arith", "test", limit=3)
    runs = parse_runs("target-only,ngram,aasd")
    assert [(r.mode, r.arbiter, r.spec_type) for r in runs] == [
        ("target-only", None, None), ("speculative", "target", "ngram"), ("speculative", "aasd", None)]
    with Engine.open_default(n_threads=1, calibration=None) as engine:
        summary = evaluate(engine, problems, runs, score, tmp_path, GenerationParams(max_tokens=64))
    records = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    texts = {(r["problem_id"], r["run"]): r["completion"] for r in records}
    assert all(texts[p.id, "ngram"] == texts[p.id, "target-only"] for p in problems)
    assert summary["runs"]["ngram"]["accuracy"] == summary["runs"]["target-only"]["accuracy"]
    config = json.loads((tmp_path / "config.json").read_text())["runs"]
    assert config["ngram"]["spec_type"] == "ngram" and "spec_type" not in config["aasd"]
    assert config["aasd"]["arbiter"] == {"name": "aasd", "kind": "builtin"}


def test_a_folder_written_before_a_setting_existed_takes_more_runs_under_its_default(tmp_path):
    """An eval folder's config lacks a setting added later (e.g. aasd_alpha): it ran under that
    setting's default, so more runs at the default join it, and a run at another value is refused."""
    from dataclasses import asdict

    from cospec_local.evaluation.task_eval import merged_config

    settings = {k: v for k, v in asdict(GenerationParams()).items() if k not in ("mode", "arbiter", "stop")}
    old = {"title": "eval", "runs": {"sps": {"mode": "speculative"},
                                     "settings": {k: v for k, v in settings.items() if not k.startswith("aasd_")}}}
    new = {"title": "eval", "runs": {"aasd": {"mode": "speculative"}, "settings": settings}}
    merged = merged_config(old, new, tmp_path)
    assert set(merged["runs"]) == {"sps", "aasd", "settings"}
    other = {"title": "eval", "runs": {"aasd": {"mode": "speculative"}, "settings": {**settings, "aasd_alpha": 0.3}}}
    with pytest.raises(ValueError, match="aasd-alpha"):
        merged_config(old, other, tmp_path)
