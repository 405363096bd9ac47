"""The maintained tools of bench/ run for real at a tiny size on the demo pair, and what they print
or write means what it says. (bench/experiments/ holds one-off measurements, frozen: not run here.)

compare_llama_cpp.py needs llama.cpp's `llama-speculative-simple`, which is not built here (it
takes building llama.cpp's tools from source). Its test runs the script end to end with a stand-in
for that program: a script that records the arguments it was given and prints the final report in
the format of speculative-simple.cpp (its `decoded ... tokens in ... seconds, speed: ... t/s` and
`accept = ...%` lines). So what is tested is the command line the comparison gives llama.cpp, the
parsing of that report, the real cospec-local side and the comparison's arithmetic; llama.cpp's
own numbers are not.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import gguf
import pytest

from cospec_local import Engine
from cospec_local.models import resolve_model
from cospec_local.tasks import load_task
from cospec_local.train.warmup import ranking_auc

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
ARITH_RECORDS = BENCH / "demo_pair_eval" / "arith" / "records.jsonl"


def bench(tool: str, *args, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, str(BENCH / tool), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)
    if check:
        assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_paired_speed_pairs_runs_and_summarizes_them_again(tmp_path):
    out = tmp_path / "paired"
    ran = bench("paired_speed.py", "--task", "arith", "--limit", 2, "--repeats", 2, "--runs", "target-only,sps,sps/2",
                "-t", 1, "--out", out)
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    # every problem with every run in every repeat, once
    assert sorted((r["repeat"], r["problem_id"], r["run"]) for r in records) == sorted(
        {(r["repeat"], r["problem_id"], run) for r in records for run in ("target-only", "sps", "sps/2")})
    assert len(records) == 2 * 2 * 3
    # greedy speculative decoding is the target's own output, whatever the block length
    for pid in {r["problem_id"] for r in records}:
        assert len({r["completion"] for r in records if r["problem_id"] == pid}) == 1
    assert all(r["drafted"] == 0 for r in records if r["run"] == "target-only")
    sps2 = [r for r in records if r["run"] == "sps/2"]
    assert sum(r["drafted"] for r in sps2) > 0
    # `RUN/K` drafts the draft model's blocks at K at most (the n-gram drafter's, which the records do
    # not tell apart, may run longer): its blocks are far shorter than sps's at K = 8
    sps8 = [r for r in records if r["run"] == "sps"]
    assert sum(r["drafted"] for r in sps2) / sum(r["blocks"] for r in sps2) < \
        sum(r["drafted"] for r in sps8) / sum(r["blocks"] for r in sps8)

    summary = json.loads((out / "results.json").read_text())
    assert summary["problems"] == 2 and summary["repeats"] == 2 and summary["baseline"] == "target-only"
    assert summary["same_tokens_every_repeat"] is True
    assert set(summary["runs"]) == {"sps", "sps/2"}
    for label, run in summary["runs"].items():
        assert len(run["ratio_per_repeat"]) == 2
        assert run["lowest"] <= run["mean"] <= run["highest"]
        lo, hi = run["pooled_ci95"]
        assert lo <= run["pooled"] <= hi
        rows = {name: [r for r in records if r["run"] == name] for name in (label, "target-only")}
        tps = {name: sum(r["tokens"] for r in rs) / sum(r["ms"] for r in rs) for name, rs in rows.items()}
        assert run["pooled"] == pytest.approx(tps[label] / tps["target-only"])

    again = bench("paired_speed.py", "--records", out / "records.jsonl", "--runs", "target-only,sps,sps/2")
    summary_lines = [line for line in ran.stdout.splitlines() if not line.startswith("repeat ")]
    assert again.stdout.splitlines() == summary_lines
    assert "same tokens in every repeat: True" in again.stdout

    neither = bench("paired_speed.py", "--runs", "sps", check=False)
    assert neither.returncode == 2 and "give --out (run) or --records (summarize a run)" in neither.stderr


def test_arbiter_ceiling_agrees_with_its_own_rows_and_the_recorded_eval(tmp_path):
    """Problems 13-16 of arith test: two the target gets wrong and one keep recovers, one it gets
    right that a keep would lose (so the arbiter's ranking and the one-keep policy have decisive
    states to work on)."""
    rows_file, states_file = tmp_path / "rows.jsonl", tmp_path / "states.jsonl"
    ran = bench("arbiter_ceiling.py", "--family", "arith", "--first", 13, "--limit", 17, "-t", 1,
                "--arbiters", "demo-features", "--records", ARITH_RECORDS, "--out", rows_file, "--states", states_file)
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()]
    assert [r["problem_id"] for r in rows] == [p.id for p in load_task("arith", "test", 17)[13:]]
    n_states = sum(len(r["states"]) for r in rows)
    assert len(states_file.read_text().splitlines()) == n_states

    head = re.search(r"arith test\[13:17\]: target right (\d+), wrong (\d+); recoverable by one keep (\d+) .*"
                     r"; states (\d+)", ran.stdout)
    right = [r for r in rows if r["target_correct"]]
    recoverable = {r["problem_id"] for r in rows
                   if not r["target_correct"] and any(s["keep_correct"] for s in r["states"])}
    assert head and tuple(map(int, head.groups())) == (len(right), len(rows) - len(right), len(recoverable), n_states)
    assert recoverable  # the range has something to recover

    line = re.search(r"demo-features \(threshold ([\d.]+)\): (\d+) keep-better and (\d+) reject-better states, "
                     r"AUC ([\d.]+); keeping once at the threshold recovers (\d+) and loses (\d+)", ran.stdout)
    assert line
    threshold = float(line.group(1))
    decisive = [(s["p_keep"]["demo-features"], int(s["keep_correct"])) for r in rows for s in r["states"]
                if s["keep_correct"] != r["target_correct"]]
    labels = [y for _, y in decisive]
    assert (int(line.group(2)), int(line.group(3))) == (sum(labels), len(labels) - sum(labels))
    assert sum(labels) and len(labels) - sum(labels)
    assert float(line.group(4)) == pytest.approx(ranking_auc([p for p, _ in decisive], labels), abs=5e-4)
    recovered, lost = set(), set()
    for r in rows:  # the one-keep policy: keep at the first state at or above the threshold, then never again
        first = next((s for s in r["states"] if s["p_keep"]["demo-features"] >= threshold), None)
        if first is not None and first["keep_correct"] != r["target_correct"]:
            (recovered if first["keep_correct"] else lost).add(r["problem_id"])
    assert (int(line.group(5)), int(line.group(6))) == (len(recovered), len(lost))
    assert recovered <= recoverable

    # the recorded eval ran the same target on the same problems: the same answers right and wrong
    assert "target-only in the records differs from this run's target on 0 problems" in ran.stdout
    assert re.search(r"^  cospec:demo-features: recovered \d+", ran.stdout, re.M)


@pytest.mark.slow
@pytest.mark.slow
def test_arbiter_heldout_counts_add_up_and_a_never_keeping_threshold_is_the_target(tmp_path):
    """At threshold 1 demo-features keeps nothing on these problems: its answers are the target's."""
    cache = tmp_path / "screen.json"
    args = ["demo-features", "demo-features@1", "--ranges", "arith:600:612", "--workers", 1, "--cache", cache]
    ran = bench("arbiter_heldout.py", *args)
    pattern = re.compile(r"^(\S+)\s+arith\s+problems (\d+)\s+target-only ([\d.]+)%\s+arbiter ([\d.]+)%\s+"
                         r"recovered (\d+)\s+lost (\d+)\s+kept (\d+)$", re.M)
    rows = {m.group(1): m.groups()[1:] for m in pattern.finditer(ran.stdout)}
    assert set(rows) == {"demo-features", "demo-features@1"}
    for n, target, arbiter, recovered, lost, kept in rows.values():
        assert int(n) == 12
        assert float(arbiter) == pytest.approx(float(target) + 100 * (int(recovered) - int(lost)) / 12, abs=0.01)
    assert rows["demo-features"][1] == rows["demo-features@1"][1]  # one screen, one target
    assert rows["demo-features@1"][2:] == (rows["demo-features@1"][1], "0", "0", "0")
    assert int(rows["demo-features"][5]) > 0  # at its own threshold it does keep

    screen = json.loads(cache.read_text())
    assert screen["key"]["problems"] == [p.id for p in load_task("arith", "dev", 612)[600:]]
    assert sum(s["target_correct"] for s in screen["screen"].values()) == round(12 * float(rows["demo-features"][1]) / 100)
    assert bench("arbiter_heldout.py", *args).stdout == ran.stdout  # from the cached screen


@pytest.mark.slow
@pytest.mark.slow
def test_serve_load_reports_each_level(tmp_path):
    ran = bench("serve_load.py", "--clients", "1,2", "--seconds", 1, "--warmup", 0, "--max-tokens", 8,
                "--", "-c", 512)
    report = json.loads(ran.stdout[:ran.stdout.index("\n| clients")])
    assert report["serve_args"] == ["-c", "512"] and report["max_tokens"] == 8
    assert [level["clients"] for level in report["levels"]] == [1, 2]
    for level in report["levels"]:
        assert level["errors"] == [] and level["requests"] > 1
        assert 0 < level["tokens_per_s"] <= 8 * level["requests_per_s"] + 0.1  # at most 8 tokens a request
        assert 0 < level["ttft_p50_s"] <= level["latency_p50_s"]
    table = [line for line in ran.stdout.splitlines() if re.match(r"\| \d+ \|", line)]
    assert [int(line.split("|")[1]) for line in table] == [1, 2]


@pytest.mark.slow
def test_costly_target_writes_the_sources_function_at_a_larger_cost(tmp_path):
    out = tmp_path / "draft-as-1b.gguf"
    ran = bench("costly_target.py", "demo-draft", out, "--size", "1b")
    assert ran.stdout.strip() == str(out)
    reader = gguf.GGUFReader(out)
    assert reader.get_field("general.architecture").contents() == "deci"
    assert reader.get_field("deci.block_count").contents() == 2 + 16  # the draft's 2 blocks, then 16 extra
    assert out.stat().st_size > 100 * resolve_model("demo-draft").stat().st_size
    prompt = load_task("arith", "test", 1)[0].prompt
    outputs = []
    for model in (resolve_model("demo-draft"), out):
        with Engine(model, n_ctx=512, n_threads=1) as engine:
            outputs.append(engine.generate(prompt, mode="target-only", max_tokens=24).tokens)
    assert len(outputs[0]) > 4 and outputs[0] == outputs[1]


STAND_IN = """\
#!{python}
# Stand-in for llama.cpp's llama-speculative-simple: records its arguments, prints the final
# report in the format of speculative-simple.cpp (LOG_INF lines, on stderr).
import json, os, sys
args = sys.argv[1:]
with open(os.environ["STAND_IN_LOG"], "a") as log:
    log.write(json.dumps(args) + "\\n")
n = int(args[args.index("-n") + 1])
sys.stdout.write("Once upon a time, in a small village by the sea, there lived ...\\n\\n")
sys.stderr.write("encoded   14 tokens in    0.012 seconds, speed: 1166.667 t/s\\n")
sys.stderr.write("decoded %4d tokens in %8.3f seconds, speed: %8.3f t/s\\n" % (n + 1, 0.025, (n + 1) / 0.025))
sys.stderr.write("\\nn_draft   = 4\\nn_predict = %d\\nn_drafted = 40\\nn_accept  = 23\\naccept    = 57.500%%\\n" % (n + 1))
"""


def stand_in(tmp_path: Path, body: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    program = bin_dir / "llama-speculative-simple"
    program.write_text(body.format(python=sys.executable))
    program.chmod(0o755)
    return bin_dir


def test_compare_llama_cpp_with_a_stand_in_for_llama_cpp(tmp_path, monkeypatch):
    log = tmp_path / "args.jsonl"
    monkeypatch.setenv("STAND_IN_LOG", str(log))
    ran = bench("compare_llama_cpp.py", "--llama-bin", stand_in(tmp_path, STAND_IN), "-m", "demo-target",
                "-md", "demo-draft", "--draft-max", 4, "-n", 32, "-t", 1, "--runs", 2, "-fa", "off")
    # the command line llama.cpp gets: the same models, K, tokens, threads, greedy, every draft token offered
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(calls) == 2
    args = calls[0]

    def opt(flag: str) -> str:
        return args[args.index(flag) + 1]

    assert opt("-m") == str(resolve_model("demo-target")) and opt("-md") == str(resolve_model("demo-draft"))
    assert (opt("--spec-draft-n-max"), opt("-n"), opt("-t"), opt("-td")) == ("4", "32", "1", "1")
    assert (opt("--temp"), opt("--top-k"), opt("--draft-p-min"), opt("-fa")) == ("0", "1", "0", "off")
    # both at llama.cpp's default, weight repacking on (the engine's default too)
    assert "--no-repack" not in args and opt("-p") == "Once upon a time, in a small village by the sea,"

    result = json.loads(ran.stdout)
    assert (result["draft_max"], result["threads"], result["runs"], result["flash_attn"]) == (4, 1, 2, "off")
    llama = result["llama_speculative_simple"]
    assert llama["runs"][0] == {"tokens": 33, "seconds": 0.025, "tps": pytest.approx(33 / 0.025, abs=1e-3),
                                "acceptance": pytest.approx(0.575)}
    ours = result["cospec_sps"]
    for run in ours["runs"]:  # the real sps loop, fixed blocks of 4
        assert run["tokens"] == 32 and run["tps"] == pytest.approx(run["tokens"] / run["seconds"], rel=1e-3)
        assert 0 < run["acceptance"] <= 1 and 0 <= run["outside_llama"] < 1
    assert result["ratio_cospec_over_llama"] == pytest.approx(ours["tps_median"] / llama["tps_median"])


def test_compare_llama_cpp_stops_with_llama_cpps_error(tmp_path):
    failing = textwrap.dedent("""\
        #!{python}
        import sys
        sys.stderr.write("error: invalid argument: --spec-type\\n")
        sys.exit(1)
        """)
    ran = bench("compare_llama_cpp.py", "--llama-bin", stand_in(tmp_path, failing), "-m", "demo-target",
                "-md", "demo-draft", "--runs", 1, check=False)
    assert ran.returncode == 1
    assert "llama-speculative-simple failed" in ran.stderr and "invalid argument: --spec-type" in ran.stderr


@pytest.mark.slow
def test_ngram_against_llama_cpp_builds_and_runs_llama_cpps_own_program(tmp_path):
    """bench/ngram_vs_llama_cpp.py builds llama-speculative-simple from the vendored source against
    the installed libraries (seconds) and runs it for real beside the engine's n-gram drafter."""
    out = tmp_path / "out"
    bench("ngram_vs_llama_cpp.py", "-m", "smollm2-135m", "--limit", 2, "-n", 24, "-t", 1,
          "--kinds", "ngram-simple,ngram-mod", "--llama-bin", tmp_path / "bin", "--out", out)
    record = json.loads((out / "results.json").read_text())
    assert (tmp_path / "bin" / "llama-speculative-simple").is_file()
    assert record["summary"]["prompts"] == len(record["rows"]) == 2
    for row in record["rows"]:
        assert set(row["llama"]) == {"ngram-simple", "ngram-mod"}
        assert all(r["tokens"] >= 24 and r["tps"] > 0 for r in row["llama"].values()), row["llama"]
        assert row["ngram_tps"] > 0 and row["target_only_tps"] > 0
        assert row["identical"] == (row["difference"] is None)
    ratios = [r["ngram_tps"] / r["target_only_tps"] for r in record["rows"]]
    assert abs(record["summary"]["ngram_over_target_only"] - (ratios[0] * ratios[1]) ** 0.5) < 1e-9
    assert "llama-speculative-simple `--spec-type ngram-mod`" in (out / "results.md").read_text()


@pytest.mark.slow
def test_verify_curves_run_the_engine_and_llama_bench_with_repacking_on_and_off(tmp_path):
    """bench/verify_curves.py builds llama-bench from the vendored source and sets the engine's
    verify costs (every row's logits) beside its (the last row's), repacking on and off."""
    out = tmp_path / "out"
    bench("verify_curves.py", "-m", "gemma3-270m", "-t", 1, "-r", 1, "--llama-bin", tmp_path / "bin", "--out", out,
          timeout=600)
    record = json.loads((out / "results.json").read_text())
    assert (tmp_path / "bin" / "llama-bench").is_file()
    assert [(r["model"], r["repack"]) for r in record["rows"]] == [("gemma3-270m", True), ("gemma3-270m", False)]
    on, off = record["rows"]
    assert on["engine"]["repacked_bytes"] > 0 and off["engine"]["repacked_bytes"] == 0
    for row in record["rows"]:
        for side in ("engine", "llama_bench"):
            curve = row[side]["verify"]
            assert row[side]["step_ms"] > 0 and sorted(curve) == ["17", "2", "3", "5", "9"]
            assert all(v > 0.5 for v in curve.values())
        # Gemma 3's 262k-row output matrix: every row's logits cost more than the last row's alone
        assert row["engine"]["verify"]["17"] > row["llama_bench"]["verify"]["17"]
    assert "| gemma3-270m | on |" in (out / "results.md").read_text()


@pytest.mark.slow
def test_repacked_identity_judges_each_difference(tmp_path):
    out = tmp_path / "identity"
    bench("repacked_identity.py", "-m", "gemma3-270m", "-md", "smollm2-135m", "--chat-template", "gemma",
          "--limit", 2, "-n", 16, "-t", 2, "--out", out, timeout=600)
    record = json.loads((out / "results.json").read_text())
    assert len(record["rows"]) == 2 and record["repacked_bytes"] > 0
    for name, s in record["summary"].items():
        rows = [r[name] for r in record["rows"]]
        assert s["identical"] == sum(r["at"] is None for r in rows)
        assert s["near_ties"] + s["other"] == sum(r["at"] is not None for r in rows)


@pytest.mark.slow
def test_category_speed_runs_fresh_processes_and_llama_cpp_per_category(tmp_path):
    """bench/category_speed.py: per category, target-only and the engine's default sources in fresh
    processes beside llama-speculative-simple, through the chat template; its summary is its rows'."""
    out = tmp_path / "categories"
    bench("category_speed.py", "-m", "smollm2-135m", "-md", "smollm2-135m-draft", "--categories", "math",
          "--limit", 1, "-n", 12, "-t", 2, "--llama-types", "draft-simple", "--llama-bin", tmp_path / "bin",
          "--out", out, timeout=900)
    record = json.loads((out / "results.json").read_text())
    assert [r["category"] for r in record["rows"]] == ["math"]
    for row in record["rows"]:
        assert row["target_only_tps"] > 0 and row["spec_tps"] > 0 and row["drafted"] >= row["accepted"] >= 0
        assert set(row["llama"]) == {"draft-simple@default", "draft-simple@4"}
        assert all(v["tps"] > 0 for v in row["llama"].values())
    math = record["summary"]["math"]
    (row,) = [r for r in record["rows"] if r["category"] == "math"]
    assert math["spec_over_target_only"] == pytest.approx(row["spec_tps"] / row["target_only_tps"])
    assert math["acceptance"] == pytest.approx(row["accepted"] / row["drafted"] if row["drafted"] else 0.0)
    assert math["ceiling"] >= 1.0
    assert (out / "results.png").stat().st_size > 1000 and "| math |" in (out / "results.md").read_text()


@pytest.mark.slow
def test_fresh_process_runs_each_reply_in_its_own_process(tmp_path):
    """bench/fresh_process.py: target-only and speculative `generate` processes per prompt, sampled
    replies run twice to check their seed reproduces them, llama.cpp's kind beside; the ratios are
    the rows' own."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Copy this sentence: the red fox runs past the old mill.\nName three colours.\n")
    out = tmp_path / "out"
    bench("fresh_process.py", "-m", "demo-target", "-md", "demo-draft", "--prompts", prompts, "--sampled", "-n", 16,
          "-t", 1, "--llama-kinds", "ngram-mod", "--llama-bin", tmp_path / "bin", "--out", out, timeout=600)
    record = json.loads((out / "results.json").read_text())
    rows = record["rows"]
    assert record["summary"]["prompts"] == len(rows) == 2
    assert all(r["reproduced"] for r in rows) and record["summary"]["reproduced"] == 2
    assert all(r["tokens"] == 16 and r["spec_tps"] > 0 and r["target_only_tps"] > 0 for r in rows)
    assert all(r["llama"]["ngram-mod"] > 0 for r in rows)
    assert len(record["summary"]["calibrations"]) == 1 and record["summary"]["calibrations"] != ["None"]
    ratios = [r["spec_tps"] / r["target_only_tps"] for r in rows]
    assert abs(record["summary"]["spec_over_target_only"] - (ratios[0] * ratios[1]) ** 0.5) < 1e-9
    assert "llama-speculative-simple `--spec-type ngram-mod`" in (out / "results.md").read_text()


@pytest.mark.slow
def test_chat_identity_compares_a_cross_vocabulary_arbiter_with_target_only(tmp_path):
    """bench/chat_identity.py on the shipped cross-vocabulary arbiter, each model in its own format:
    its counts add up, and where the gate abstains the reply is target-only's."""
    out = tmp_path / "identity.json"
    qa = REPO / "cospec_local" / "data" / "gemma3-smollm2" / "qa.jinja"
    bench("chat_identity.py", "-m", "gemma3-270m", "-md", "smollm2-135m", "--arbiter", "gemma3-smollm2-words",
          "--chat-template-file", qa, "--prompts", 3, "-n", 12, "-t", 2, "--out", out)
    result = json.loads(out.read_text())
    assert result["prompts"] == len(result["rows"]) == 3
    assert result["identical"] == sum(r["identical"] for r in result["rows"])
    assert all(r["identical"] for r in result["rows"] if r["abstained"] and r["kept"] == 0)
    assert result["sps_identical"] == sum(r["sps_identical"] for r in result["rows"])
    assert result["same_as_sps"] == sum(r["same_as_sps"] for r in result["rows"])
    assert result["command"]["chat_template_file"] == str(qa)


@pytest.mark.slow
def test_structured_output_measures_each_configuration_and_checks_lossless(tmp_path):
    out = tmp_path / "grammar.json"
    bench("structured_output.py", "--prompts", 2, "--repeats", 1, "-n", 24, "--out", out)
    report = json.loads(out.read_text())
    assert set(report["tokens_per_s"]) == {"target-only", "target-only + grammar", "speculative",
                                           "speculative + grammar"}
    assert all(v > 0 for v in report["tokens_per_s"].values()) and report["lossless_under_grammar"] is True
    assert report["grammar_cost"]["speculative"] == pytest.approx(
        report["tokens_per_s"]["speculative + grammar"] / report["tokens_per_s"]["speculative"])


# ---------------------------------------------------------------- the cross-family and draft-source measurements

@pytest.mark.slow
def test_cross_vocab_measures_both_directions_and_checks_they_are_lossless(tmp_path):
    out = tmp_path / "cross"
    # (plain kernels: repacked ones round Gemma's near ties otherwise in a verify; test_weight_repacking.py)
    bench("cross_vocab.py", "-n", 8, "--repeats", 1, "--limit", 2, "-t", 2, "--no-repack", "--out", out)
    record = json.loads((out / "results.json").read_text())
    assert set(record["summary"]) == {"gemma3-270m <- smollm2-135m", "smollm2-135m <- gemma3-270m"}
    for runs in record["summary"].values():
        assert set(runs) == {"target-only", "draft K=4", "draft adaptive"}
        assert runs["target-only"]["pooled"] == pytest.approx(1.0) and runs["target-only"]["agreement"] is None
        assert runs["draft K=4"]["proposed"] > 0 and 0 <= runs["draft K=4"]["agreement"] <= 1
        assert all(r["identical"] == r["runs"] == 2 for r in runs.values())  # greedy speculation is lossless
    assert record["command"][:2] == ["python", "bench/cross_vocab.py"] and "cpu" in json.dumps(record["machine"])


@pytest.mark.slow
def test_source_choice_runs_each_draft_source_against_the_target_alone(tmp_path):
    out = tmp_path / "sources"
    bench("source_choice.py", "-n", 8, "--repeats", 1, "--limit", 2, "-t", 2, "--out", out)
    summary = json.loads((out / "results.json").read_text())["summary"]
    assert set(summary) == {"target-only", "ngram", "draft", "ngram,draft"}
    assert all(s["identical"] == s["runs"] == 2 for s in summary.values())
    assert summary["target-only"]["pooled"] == pytest.approx(1.0) and summary["target-only"]["geomean"] == pytest.approx(1.0)
    assert "| ngram,draft |" in (out / "results.md").read_text()


@pytest.mark.slow
def test_headroom_reads_the_second_direction_from_the_first_ones_runs(tmp_path):
    """One eval folder per task: the other direction is the same two runs with the roles swapped,
    so only-the-draft there is only-the-target here."""
    out = tmp_path / "headroom"
    bench("headroom.py", "--tasks", "capitals", "--limit", 4, "-n", 8, "-t", 2, "--out", out)
    summary = json.loads((out / "results.json").read_text())["summary"]
    one, other = summary["gemma3-270m <- smollm2-135m: capitals"], summary["smollm2-135m <- gemma3-270m: capitals"]
    assert one["problems"] == other["problems"] == 4
    assert (one["target"], one["draft"], one["union"]) == (other["draft"], other["target"], other["union"])
    assert (one["only_draft"], one["only_target"]) == (other["only_target"], other["only_draft"])
    assert one["headroom_points"] == pytest.approx(100 * one["only_draft"] / 4)
    assert len(list(out.glob("*/capitals/records.jsonl"))) == 1


def test_mix_headroom_counts_each_family_by_format(tmp_path):
    """bench/mix_headroom.py: per family and drawn format, each model alone; the counts add up to the
    eval's own records."""
    out = tmp_path / "mix"
    bench("mix_headroom.py", "-m", "smollm2-135m", "-md", "smollm2-135m-draft", "--families", "counts,multiplication",
          "--limit", 6, "-n", 8, "--out", out)
    summary = json.loads((out / "results.json").read_text())["summary"]
    for family in ("counts", "multiplication"):
        counts = summary[family]
        assert counts["all"]["problems"] == 6
        assert sum(counts[f]["problems"] for f in ("raw", "qa", "chat") if f in counts) == 6
        records = [json.loads(line) for line in (out / family / "records.jsonl").read_text().splitlines()]
        assert counts["all"]["target"] == sum(r["correct"] for r in records if r["run"] == "target-only")
        assert counts["all"]["draft"] == sum(r["correct"] for r in records if r["run"] == "draft-only")
        assert counts["all"]["only_draft"] <= counts["all"]["draft"]


@pytest.mark.slow
def test_cross_vocab_arbiter_holds_the_shipped_arbiter_to_its_bars(tmp_path):
    out = tmp_path / "arbiter"
    bench("cross_vocab_arbiter.py", "--arbiter", "gemma3-smollm2-words", "--tasks", "capitals", "--limit", 4,
          "--chat-prompts", 2, "-n", 8, "-t", 2, "--out", out, timeout=600)
    record = json.loads((out / "results.json").read_text())
    fields = record["summary"]["capitals"]
    assert set(fields["bars"]) == {"points", "recovered_share", "losses", "speed_over_sps"}
    assert all(isinstance(ok, bool) for ok in fields["bars"].values())
    assert record["chat_identity"]["prompts"] == 2 and 0 <= record["chat_identity"]["identical_share"] <= 1
    assert "Verdict:" in (out / "results.md").read_text()


@pytest.mark.slow
def test_paper_table_gives_every_row_of_the_papers_comparison(tmp_path):
    out = tmp_path / "table"
    bench("paper_table.py", "--pair", "gemma3", "--tasks", "antonyms", "--limit", 3, "--chat-prompts", 2, "-t", 2,
          "--out", out, timeout=900)
    record = json.loads((out / "results.json").read_text())
    task = record["summary"]["gemma3"]["tasks"]["antonyms"]
    runs = task["runs"]
    assert list(runs) == ["target-only", "draft-only", "SpS", "n-gram alone (REST's place)", "FLy", "AASD", "CoSpec"]
    assert task["problems"] == 3 and runs["target-only"]["speedup"] == pytest.approx(1.0)
    # the lossless rows give target-only's answers (greedy), and recoveries never exceed what the draft alone won
    for lossless in ("SpS", "n-gram alone (REST's place)"):
        assert runs[lossless]["accuracy"] == runs["target-only"]["accuracy"] and runs[lossless]["losses"] == 0
    assert all(r["recovered"] <= task["draft_only_successes"] for name, r in runs.items() if r["recovered"] is not None)
    assert max(runs["target-only"]["accuracy"], runs["draft-only"]["accuracy"]) <= task["union"]
    assert record["summary"]["gemma3"]["chat_identity"]["prompts"] == 2
    text = (out / "results.md").read_text()
    assert "Verdict:" in text and "- antonyms: CoSpec" in text and "| AASD |" in text


@pytest.mark.slow
def test_gate_admission_counts_what_the_engines_gate_admits(tmp_path):
    out = tmp_path / "gate.json"
    bench("gate_admission.py", "-m", "demo-target", "-md", "demo-draft", "--arbiter", "demo-features",
          "--formats", "raw", "--prompts", "arith,listops,chat", "-n", 20, "--out", out)
    rows = {r["prompts"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["arith"]["admitted"] >= 19 and rows["listops"]["admitted"] == 0 and rows["chat"]["admitted"] == 0
    assert all(r["n"] == 20 and 0 <= r["min_score"] <= r["median_score"] <= 1 for r in rows.values())


@pytest.mark.slow
def test_rollback_cost_measures_a_recurrent_target_beside_an_attention_one_and_llama_cpp(tmp_path):
    out = tmp_path / "rollback"
    bench("rollback_cost.py", "--targets", "llama,mamba2", "-n", 8, "--runs", 1, "--repeat-prompt", 2, "-t", 2,
          "--llama-bin", tmp_path / "bin", "--out", out, timeout=600)
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert set(rows) == {"llama", "mamba2"}
    assert rows["llama"]["kind"].startswith("attention") and not rows["mamba2"]["kind"].startswith("attention")
    for row in rows.values():
        assert row["identical"] and row["generated"] >= 8  # the refused draft never changes the output
        assert row["sps_over_target_only"] > 0 and row["sps_over_llama"] > 0
    assert rows["llama"]["over_attention"] == pytest.approx(1.0)  # the only attention target is the median
    assert rows["mamba2"]["restored"] > 0  # a recurrent memory is restored from saved states, not cut


def test_speed_ceiling_finds_the_best_block_against_the_calibrated_costs(tmp_path):
    """bench/speed_ceiling.py on two calibrations whose answers are known in closed form."""
    from cospec_local import calibration as calibration_store

    def stored(name: str, verify: list[float], draft: float) -> Path:
        numbers = {"version": calibration_store._cospec.CALIBRATION_VERSION, "target_step_ms": 10.0,
                   "verify": verify, "draft_first": draft, "draft_step": draft, "catch_up": 0.0,
                   "draft_acceptance": -1.0, "draft_acceptance_sampled": -1.0, "ngram_acceptance": [-1.0] * calibration_store._cospec.N_NGRAM_BUCKETS}
        pair = {"target": {"file": "t.gguf"}, "draft": {"file": "d.gguf"}}
        path = tmp_path / f"{name}.json"
        calibration_store.write(calibration_store.Calibration(numbers, pair, {"cpu": "test", "n_threads": 2}), path)
        return path

    n = calibration_store._cospec.N_DRAFT_MAX + 1
    # Each verified token a full step, each draft token a tenth: no acceptance below 1 pays.
    linear = stored("linear", [float(i + 1) for i in range(n)], 0.1)
    out = bench("speed_ceiling.py", linear, "--acceptance", "0.5,0.99", "--goal", 1.0)
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["acceptance_for_goal"] is None and "out of reach" in out.stdout
    assert all(row["speed"] < 1.0 and row["best_k"] == 1 for row in result["rows"])
    assert result["rows"][0]["speed"] == pytest.approx(1.5 / (0.1 + 2.0))
    # Free drafts and free verification: the longest block wins, and 1.5x needs 1 + a + a^2 + ... >= 1.5.
    free = stored("free", [1.0] * n, 0.0)
    result = json.loads(bench("speed_ceiling.py", free, "--acceptance", "0.5", "--goal", 1.5).stdout.splitlines()[-1])
    assert result["rows"][0]["best_k"] == n - 1 and result["rows"][0]["speed"] == pytest.approx(2.0, abs=1e-6)
    assert result["acceptance_for_goal"] == pytest.approx(0.335)
