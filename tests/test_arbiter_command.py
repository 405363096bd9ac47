"""`cospec-local arbiter` (train, list, show) and what an arbiter records about its training:
run as a user runs them, on the demo pair."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

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
    assert set(rows) == {"demo-lora", "demo-features", "smollm2-arith", "gemma3-smollm2-words"}
    arith = rows["smollm2-arith"]  # its draft is derived on first use: listed without being made
    assert arith["where"] == "bundled" and arith["kind"] == "features" and arith["evaluation"] is not None
    lora = rows["demo-lora"]
    assert lora["where"] == "bundled" and lora["kind"] == "lora" and lora["draft_file"] == "demo-draft-q8_0.gguf"
    assert lora["trained_under"]["draft_max"] == 8 and 0.5 < lora["threshold"] < 0.6
    assert {"arbiter.gguf", "adapter.gguf", "head.onnx"} <= set(lora["files"])
    assert set(lora["evaluation"]) == {"arith (test)", "pyfunc (test)"}  # recorded with `arbiter record`
    out = run_cli("arbiter", "show", "demo-features", env=env)
    assert out.returncode == 0, out.stderr
    assert "demo-features (bundled, features)" in out.stdout and "blocks of up to 8 tokens" in out.stdout
    out = run_cli("arbiter", "show", "nonsense", env=env)
    assert out.returncode == 1 and "no arbiter 'nonsense'" in out.stderr and "demo-lora" in out.stderr


@pytest.mark.slow
def test_every_report_ends_with_the_verdict_its_own_numbers_give(tmp_path):
    """The shipped arbiters' recorded evaluations: demo-lora beats sps beyond the intervals on arith,
    and on pyfunc the draft alone scores as high and runs faster; smollm2-arith's draft alone is
    better. list, show and eval's results say so, with the baseline named."""
    import json

    from cospec_local.evaluation.task_eval import markdown

    env = {"COSPEC_LOCAL_ARBITERS": str(tmp_path / "none-yet")}
    listed = run_cli("arbiter", "list", env=env).stdout
    lora = next(line for line in listed.splitlines() if line.startswith("demo-lora"))
    assert "arith (test): target 78.2% -> 86.4% at 1.47x target-only (use the arbiter)" in lora
    assert "pyfunc (test): target 84.0% -> 97.0% at 1.39x target-only (the draft alone is as good or better and " \
           "faster)" in lora
    assert "(the draft alone is better and faster)" in next(l for l in listed.splitlines() if l.startswith("smollm2"))
    shown = run_cli("arbiter", "show", "demo-lora", env=env).stdout
    assert "verdict: use the arbiter: 86.4% against sps's 78.2%, beyond the 95% intervals" in shown
    assert "verdict: the draft alone is as good or better (97.8% against 97.0%) and faster (3.63x against 1.39x " \
           "target-only): --mode draft-only" in shown
    summary = json.loads((Path(__file__).resolve().parents[1] / "bench" / "demo_arbiters_eval" / "arith"
                          / "results.json").read_text())
    table = markdown(summary, "arith")
    assert "speed-up over target-only" in table
    assert "- cospec:demo-lora: use the arbiter: 86.4% against sps's 78.2%" in table
    assert "- cospec:demo-features: no reliable difference from sps (84.2% against 78.2%" in table


@pytest.mark.slow
def test_an_eval_of_an_arbiter_is_recorded_for_show(tmp_path):
    """`arbiter record`: what eval measured of these very files joins the arbiter's record; an
    eval of other files, or one without target-only to compare with, is refused and writes nothing."""
    import shutil

    from cospec_local.arbiter.catalog import DEMO_ARBITERS_DIR

    mine = tmp_path / "mine"
    shutil.copytree(DEMO_ARBITERS_DIR / "lora", mine)
    (mine / "evaluation.json").unlink()  # these files with nothing recorded yet
    for folder, runs, extra in (("e", f"target-only,sps,cospec:{mine}", ()),
                                ("other", "target-only,cospec:demo-features", ()),
                                ("no-target", f"sps,cospec:{mine}", ()),
                                ("threshold", f"target-only,cospec:{mine}", ("--arbiter-threshold", 0.9)),
                                ("smaller", f"target-only,cospec:{mine}", ("--limit", 2))):
        out = run_cli("eval", "--task", "arith", "--limit", 3, "--runs", runs, "--out", tmp_path / folder, "-t", 1,
                      *extra)
        assert out.returncode == 0, out.stderr
    out = run_cli("arbiter", "record", mine, tmp_path / "e")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"{mine}: arith (test), 3 problems: target-only ")
    row = json.loads(run_cli("arbiter", "show", mine, "--json").stdout)
    entry = row["evaluation"]["arith (test)"]
    assert entry["problems"] == 3 and set(entry["runs"]) == {"target-only", "sps", "lora"}
    assert entry["runs"]["lora"]["n"] == 3 and entry["recorded_from"]["settings"]["draft_max"] == 8
    before = (mine / "evaluation.json").read_text()
    out = run_cli("arbiter", "record", mine, tmp_path / "other")
    assert out.returncode == 1 and "has no run of this arbiter's files" in out.stderr
    out = run_cli("arbiter", "record", mine, tmp_path / "no-target")
    assert out.returncode == 1 and "no target-only run" in out.stderr
    out = run_cli("arbiter", "record", mine, tmp_path / "threshold")
    assert out.returncode == 1 and "ran the arbiter with --arbiter-threshold" in out.stderr
    out = run_cli("arbiter", "record", mine, tmp_path / "smaller")  # 2 problems would replace 3
    assert out.returncode == 1 and "--replace" in out.stderr
    out = run_cli("arbiter", "record", mine, tmp_path / "smaller", tmp_path / "other", "--replace")
    assert out.returncode == 1  # one bad folder: nothing written, not even the good one's entry
    assert (mine / "evaluation.json").read_text() == before
    out = run_cli("arbiter", "record", mine, tmp_path / "smaller", "--replace")
    assert out.returncode == 0, out.stderr
    assert json.loads((mine / "evaluation.json").read_text())["evaluation"]["arith (test)"]["problems"] == 2


def test_the_demo_arbiters_recorded_evaluations_are_of_their_current_files():
    """Each bundled demo arbiter's recorded evaluation names an eval folder in this repository whose
    config ran these very files, and its numbers are that folder's results."""
    from pathlib import Path

    from cospec_local.arbiter.catalog import NAMED_ARBITERS, arbiter_identity
    from cospec_local.arbiter.evaluations import describe_arbiter

    for name in ("demo-lora", "demo-features"):
        row = describe_arbiter(NAMED_ARBITERS[name].path, name=name)
        assert set(row["evaluation"]) == {"arith (test)", "pyfunc (test)"}, name
        for title, entry in row["evaluation"].items():
            folder = Path(row["path"]) / entry["recorded_from"]["folder"]  # relative to the arbiter's folder
            assert folder.resolve().parent.name == "demo_arbiters_eval"
            config = json.loads((folder / "config.json").read_text())
            results = json.loads((folder / "results.json").read_text())
            assert config["runs"][f"cospec:{name}"]["arbiter"]["sha256"] == arbiter_identity(name)["sha256"], title
            assert entry["runs"][row["kind"]]["accuracy"] == results["runs"][f"cospec:{name}"]["accuracy"]
            assert entry["runs"]["target-only"]["accuracy"] == results["runs"]["target-only"]["accuracy"]


# ---------------------------------------------------------------- train

# A few minutes on 2 cores: the demo pair on arith, few problems (its headroom is large: the demo
# draft solves arithmetic the target misses).
TRAIN_ARGS = ("--task", "arith", "--train", 120, "--dev", 30, "--test", 30, "--kinds", "features,lora", "-t", 2)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One `arbiter train` run, interrupted once during collection and resumed with the same command."""
    root = tmp_path_factory.mktemp("own-pair")
    env = {"COSPEC_LOCAL_ARBITERS": str(root / "arbiters")}
    work = root / "work"
    command = [*CLI, "arbiter", "train", "mine", "--work", str(work), *map(str, TRAIN_ARGS)]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, **env}, start_new_session=True)
    import signal
    import time

    deadline = time.time() + 900
    while time.time() < deadline and child.poll() is None:  # interrupt once some problems are collected
        done = list(work.glob("collect-*/problems.jsonl"))
        if done and len(done[0].read_text().splitlines()) >= 20:
            os.killpg(child.pid, signal.SIGINT)
            break
        time.sleep(0.2)
    _, interrupted_err = child.communicate(timeout=300)
    out = run_cli("arbiter", "train", "mine", "--work", work, *TRAIN_ARGS, env=env)
    return dict(root=root, env=env, work=work, out=out, interrupted=child.returncode, interrupted_err=interrupted_err)


@pytest.mark.slow
def test_train_interrupted_then_resumed_installs_a_working_arbiter(trained):
    out = trained["out"]
    assert trained["interrupted"] == 130, trained["interrupted_err"][-2000:]
    assert "rerun the same command to resume" in trained["interrupted_err"]
    assert out.returncode == 0, out.stderr[-3000:]
    assert "headroom on 30 dev problems" in out.stderr and "installed mine" in out.stderr
    folder = trained["root"] / "arbiters" / "mine"
    assert {"arbiter.gguf", "info.json", "evaluation.json"} <= {p.name for p in folder.iterdir()}
    record = json.loads((folder / "evaluation.json").read_text())
    runs = record["evaluation"]["arith"]["runs"]
    assert set(runs) == {"target-only", "draft-only", "sps", record["kind"]} and record["kind"] in ("lora", "features")
    assert runs["target-only"]["n"] == 30
    # Its domain gate is the classifier: it admits the task in other words and refuses chat and listops.
    from cospec_local import Engine
    from cospec_local.arbiter.domain_gate import ClassifierGate
    from cospec_local.arbiter.file_format import read_gate
    from cospec_local.tasks import load_task

    gate = read_gate(folder)
    assert isinstance(gate, ClassifierGate)
    with Engine("demo-target", None, n_ctx=512, n_threads=1, calibration=None) as engine:
        def admitted(prompts):
            return sum(gate.admits(engine.tokenize(p)) for p in prompts) / len(prompts)
        arith = [p.prompt for p in load_task("arith", "test", 40)]
        assert admitted(arith) >= 0.95 and admitted(["User: " + p + "\nAssistant:" for p in arith]) >= 0.9
        assert admitted([p.prompt for p in load_task("listops", "test", 40)]) == 0.0
        assert admitted(["Why is the sky blue?", "Write a short poem about autumn."]) == 0.0


@pytest.mark.slow
def test_resumed_collection_equals_an_uninterrupted_one(trained, tmp_path):
    """The interrupted run's states are those a run without interruption collects."""
    command = ["--out", tmp_path / "states", "--families", "arith", "--train", 120, "--dev", 30, "--threads", 2,
               "--max-tokens", 256]
    out = subprocess.run([sys.executable, "-m", "cospec_local.train.collect", *map(str, command)],
                         capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stderr[-2000:]
    [collected] = trained["work"].glob("collect-*/states.jsonl")  # one collection: the resumed run reused it
    resumed = sorted(collected.read_text().splitlines())
    assert resumed == sorted((tmp_path / "states" / "states.jsonl").read_text().splitlines())


@pytest.mark.slow
def test_the_installed_arbiter_is_found_by_name_everywhere(trained):
    env = trained["env"]
    out = run_cli("arbiter", "list", env=env)
    assert out.returncode == 0 and any(line.startswith("mine") and "installed" in line for line in out.stdout.splitlines())
    out = run_cli("arbiter", "show", "mine", env=env)
    assert out.returncode == 0 and "mine (installed" in out.stdout
    assert "evaluation (held-out test sets)\n    arith: 30 problems (arbiter train's held-out test split)" in out.stdout
    out = run_cli("generate", "-p", "Mei has 9 stamps. Mei buys 4 more stamps. How many stamps does Mei have now?",
                  "--arbiter", "mine", "-n", 40, "--json", env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["arbiter"] == "mine"


@pytest.mark.slow
def test_refusals_are_one_clear_line_and_write_nothing(trained, tmp_path):
    env = trained["env"]
    out = run_cli("arbiter", "train", "mine", "--work", tmp_path / "w", *TRAIN_ARGS, env=env)
    assert out.returncode == 1 and "already installed" in out.stderr and "--force" in out.stderr
    assert not (tmp_path / "w").exists()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "What is 1 + 1?", "answer": 2}\n{"prompt": "What is 2 + 2?"}\n')
    out = run_cli("arbiter", "train", "other", "--work", tmp_path / "w2", "--task", bad, env=env)
    assert out.returncode == 1 and f"{bad}:2: no 'answer'" in out.stderr and "Traceback" not in out.stderr
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    out = run_cli("arbiter", "train", "other", "--work", tmp_path / "w3", "--task", empty, env=env)
    assert out.returncode == 1 and "no train problems" in out.stderr and "Traceback" not in out.stderr
    out = run_cli("arbiter", "train", "other", "--work", tmp_path / "w4", "-m", "demo-target", "-md",
                  "smollm2-135m", env=env)
    assert out.returncode == 1 and "vocabular" in out.stderr.lower() and "Traceback" not in out.stderr
    assert not (trained["root"] / "arbiters" / "other").exists()


@pytest.mark.slow
def test_no_headroom_reports_and_stops(trained, tmp_path):
    """Where the draft solves nothing the target misses (the target as its own draft), the run
    prints the headroom and stops before collecting."""
    from cospec_local.models import resolve_model

    target = resolve_model("demo-target")
    out = run_cli("arbiter", "train", "same", "--work", tmp_path / "w", "-m", target, "-md", target, "--task",
                  "arith", "--dev", 20, env=trained["env"])
    assert out.returncode == 1, out.stderr
    assert "headroom on 20 dev problems" in out.stderr and "no headroom" in out.stderr
    assert "--ignore-headroom" in out.stderr and not list((tmp_path / "w").glob("collect-*"))
    assert "The demo models know only their task families' wording" in out.stderr  # a user's own file: why


def test_eval_and_bench_run_cospec_by_default_where_an_arbiter_ships(tmp_path):
    out = run_cli("eval", "--task", "arith", "--limit", 1, "-n", 32, "-t", 1, "--json")
    assert out.returncode == 0, out.stderr
    assert set(json.loads(out.stdout)["runs"]) == {"target-only", "draft-only", "sps", "fly", "cospec"}
    out = run_cli("bench", "--task", "arith", "--n-prompts", 1, "-n", 16, "--repeat", 1, "-t", 1, "--json")
    assert out.returncode == 0, out.stderr
    assert {r["run"] for r in json.loads(out.stdout)["results"]} == {"target-only", "sps", "fly", "cospec"}
    out = run_cli("bench", "-m", "smollm2-135m", "-md", "smollm2-135m-first4", "--n-prompts", 2)
    assert out.returncode == 2 and "--n-prompts counts task prompts: give --task too" in out.stderr


@pytest.mark.slow
def test_a_second_round_learns_from_the_states_its_arbiter_meets(trained):
    """--rounds 2 on the same work folder: round one's stages are reused, round two collects the
    states round one's chosen arbiter meets (each choice continued by it), warms up on both
    rounds' states, and the installed record tells the rounds apart."""
    env = trained["env"]
    work = trained["work"]
    out = run_cli("arbiter", "train", "mine", "--work", work, *TRAIN_ARGS, "--rounds", 2, "--force", env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "round 2 decision states:" in out.stderr and "installed mine" in out.stderr
    assert len(list(work.glob("collect-*/states.jsonl"))) == 2  # round one's collection was reused
    [policy_manifest] = work.glob("collect-2-*/manifest.json")
    assert json.loads(policy_manifest.read_text())["policy"]["kind"] == "learned"
    record = json.loads((trained["root"] / "arbiters" / "mine" / "evaluation.json").read_text())
    first, second = record["states"]["rounds"]
    assert (first["round"], second["round"]) == (1, 2) and second["states"] > 0
    assert first["folder"] != second["folder"] and record["recipe"]["rounds"] == 2
    assert record["evaluation"]["arith"]["runs"]["target-only"]["n"] == 30


def test_a_collection_too_small_for_the_warm_up_is_said_before_it_starts():
    from cospec_local.train.arbiter_recipe import MIN_DECISIVE_STATES, SplitSizes, too_few_states_warning

    def sizes(train):
        return SplitSizes(train=train, dev=100, test=200, train_exhausted=False, dev_exhausted=False)

    pilot = {"collect_pilot": {"problems": 6, "decisive_per_problem": 0.5}}
    said = too_few_states_warning(pilot, sizes(40), 1)
    assert said is not None and f"the {MIN_DECISIVE_STATES} the warm-up needs" in said and "--train 161" in said
    assert too_few_states_warning(pilot, sizes(400), 1) is None
    assert "part ways more often" in too_few_states_warning({"collect_pilot": {"problems": 6,
                                                                                "decisive_per_problem": 0.0}},
                                                             sizes(400), 1)
    assert too_few_states_warning({}, sizes(40), 1) is None  # a headroom recorded before the pilot: nothing to go on


def test_the_plan_counts_what_a_small_file_gives_and_advises_more_rows_not_flags(tmp_path):
    """A fixed file cannot give more problems than its rows: the plan says how many the run uses,
    and the advice asks for rows, not for --train."""
    from cospec_local.tasks import load_task
    from cospec_local.train.arbiter_recipe import (RecipeSettings, SplitSizes, available_problems, more_problems_advice,
                                           too_few_states_warning)

    task = tmp_path / "mine.jsonl"
    task.write_text("".join(json.dumps({"prompt": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
                            for i in range(60)))
    settings = RecipeSettings(name="x", tasks=(str(task), "arith"))
    available = available_problems(settings)
    in_file = {split: len(load_task(task, split)) for split in ("train", "dev", "test")}
    assert available == {split: [n, None] for split, n in in_file.items()}
    assert sum(in_file.values()) == 60 and in_file["train"] < 1000
    sizes = SplitSizes.plan(available, settings, 1000)
    assert (sizes.train, sizes.dev, sizes.test) == (in_file["train"] + 1000, in_file["dev"] + 100, in_file["test"] + 200)
    assert not sizes.train_exhausted  # the generated family gives any number
    only_file = SplitSizes.plan(available_problems(RecipeSettings(name="x", tasks=(str(task),))), settings, 1000)
    assert only_file.train_exhausted and only_file.dev_exhausted
    assert only_file.text(1) == (f"{in_file['train']} train (all the task files have), {in_file['dev']} dev (all the "
                                 f"task files have) and {in_file['test']} test problems")
    advice = more_problems_advice(only_file, 1)
    assert "more rows in the task files" in advice and "--train" not in advice
    said = too_few_states_warning({"collect_pilot": {"problems": 6, "decisive_per_problem": 0.2}}, only_file, 1)
    assert "more rows in the task files" in said and "--train" not in said


def test_a_draft_alone_within_the_intervals_and_faster_is_the_verdict():
    """The verdict weighs every option: an arbiter ahead of the draft alone, but not beyond the
    95% intervals, while the draft alone runs three times faster, is not worth using."""
    from cospec_local.arbiter.evaluations import verdict

    runs = {"target-only": {"accuracy": 0.13, "accuracy_ci95": [0.08, 0.21], "speedup": 1.0},
            "draft-only": {"accuracy": 0.69, "accuracy_ci95": [0.59, 0.77], "speedup": 2.19},
            "sps": {"accuracy": 0.13, "accuracy_ci95": [0.08, 0.21], "speedup": 1.71},
            "cospec": {"accuracy": 0.74, "accuracy_ci95": [0.65, 0.82], "speedup": 0.74}}
    said = verdict(runs, "cospec")
    assert said.short == "the draft alone is as good within the 95% intervals and faster"
    assert "--mode draft-only" in said.text and "draft-only 69.0% (59-77) at 2.19x" in said.text
    # the same arbiter beyond the draft's interval is worth using; slower drafts do not count against it
    assert verdict({**runs, "cospec": {**runs["cospec"], "accuracy": 0.9, "accuracy_ci95": [0.82, 0.95]}},
                   "cospec").short == "use the arbiter"
    assert verdict({**runs, "draft-only": {**runs["draft-only"], "speedup": 0.5}}, "cospec").short == "use the arbiter"


def test_rows_of_a_training_file_are_listed_apart():
    from cospec_local.arbiter.evaluations import on_training_file

    assert on_training_file("bench/headroom/tasks/capitals-train.jsonl")
    assert on_training_file("capitals-train-varied.jsonl") and not on_training_file("capitals-test.jsonl (all)")
    assert not on_training_file("arith (test)") and not on_training_file("cospec_local/data/x/arithmetic.jsonl")
    env = {"COSPEC_LOCAL_ARBITERS": "/nonexistent-arbiters"}
    listed = next(line for line in run_cli("arbiter", "list", env=env).stdout.splitlines()
                  if line.startswith("gemma3-smollm2-words "))
    assert "capitals-test.jsonl" in listed and "-train" not in listed
    shown = run_cli("arbiter", "show", "gemma3-smollm2-words", env=env).stdout
    tests, apart = shown.split("on its training files")
    assert "evaluation (held-out test sets)" in tests and "capitals-test.jsonl (all): 113 problems" in tests
    assert "-train.jsonl" not in tests and "capitals-train.jsonl: 21 problems (arbiter train's held-out part" in apart
