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


@pytest.mark.slow
def test_bench_json(target_path, draft_paths, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The capital of France is\nWrite a poem about rain.\n")
    out = run_cli("bench", "-m", target_path, "-md", draft_paths["disagreeing"], "--prompts", prompts,
                  "--draft-max", "1,3", "-n", 16, "--repeat", 2, "--json", "--out", tmp_path / "bench")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    written = json.loads((tmp_path / "bench" / "bench.json").read_text())  # the record, with its command
    assert written["results"] == report["results"] and written["command"][:2] == ["cospec-local", "bench"]
    assert "| K | run |" in (tmp_path / "bench" / "bench.md").read_text()
    rows = report["results"]
    # target-only has no K: measured once (per prompt and repeat), the baseline of every row
    assert [(r["draft_max"], r["run"]) for r in rows] == [(None, "target-only")] + [
        (k, m) for k in (1, 3) for m in ("sps", "fly")]
    for r in rows:
        assert r["tokens"] == 2 * 16 * 2
        if r["run"] == "target-only":
            assert r["speedup"] == pytest.approx(1.0) and r["speedup_bound"] is None and r["noisy"] is None
        else:
            assert r["speedup"] > 0 and 0 <= r["acceptance_rate"] <= 1
            assert r["speedup_bound"] > 0  # a ratio of timings: its size is for bench results, not a unit test
            assert len(r["speedup_per_repeat"]) == 2 and isinstance(r["noisy"], bool)
            lo, hi = min(r["speedup_per_repeat"]), max(r["speedup_per_repeat"])
            assert r["noisy"] == ((hi - lo) / 2 > abs(r["speedup"] - 1.0))
        if r["run"] == "sps":
            assert r["prompts_identical_to_target"] == 2
    assert 0 <= report["other_load"] <= 1  # what else used the machine meanwhile, recorded beside the ratios
    assert report["c"] > 0  # measured (how much cheaper the draft is belongs to bench results, not a unit test)
    assert report["costs"]["draft_cost"] == pytest.approx(report["c"], abs=1e-4) and report["costs"]["verify_cost"] >= 0


@pytest.mark.slow
def test_bench_gives_no_bound_for_blocks_shorter_than_k(target_path, draft_paths):
    """The speed bound models blocks of exactly K tokens: with --draft-p-min (blocks end early)
    and with adaptive lengths a row has none, rather than a bound of another loop. The target
    drafting for itself is accepted throughout, so both runs do draft blocks (flash attention on:
    there the batched pass rounds as the one-token pass does, so sps is also target-only)."""
    for flags in (["--draft-p-min", "0.9"], ["--adaptive-draft"]):
        out = run_cli("bench", "-m", target_path, "-md", draft_paths["self"], "-fa", "on", "--runs", "target-only,sps",
                      "--draft-max", "4", "-n", 16, "--repeat", 1, "--json", *flags)
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        (sps,) = [r for r in report["results"] if r["run"] == "sps"]
        assert sps["mean_accepted_per_block"] > 0 and sps["speedup_bound"] is None
        assert sps["prompts_identical_to_target"] == report["prompts"]


def test_bench_measures_the_verify_cost_on_full_blocks(engine_for):
    """The cost model's verify cost comes from blocks of exactly K tokens whatever the bench's
    own --draft-p-min or adaptive setting (blocks cut short would make verifying look cheap)."""
    from cospec_local import GenerationParams
    from cospec_local.evaluation.bench import measure_costs

    engine = engine_for("self")
    seen = []

    class RecordingEngine:  # the real engine; keeps each run's stats
        def generate(self, *args, **kwargs):
            result = engine.generate(*args, **kwargs)
            seen.append(result.stats)
            return result

    params = GenerationParams(max_tokens=33, ignore_eos=True, draft_p_min=0.999, adaptive_draft=True)
    prompts = [engine.tokenize("The capital of France is"), engine.tokenize("def add(a, b):")]
    measure_costs(RecordingEngine(), prompts, params, {"draft-only": 1.0, "target-only": 1.0}, k=8)
    assert len(seen) == 2  # one run per prompt
    for stats in seen:  # every block but the last (cut at max_tokens) drafted K tokens
        assert stats.blocks >= 2 and stats.draft_n >= 8 * (stats.blocks - 1)


def spawn_chat(target_path, draft_path):
    env = dict(os.environ, TERM="dumb", PYTHONUNBUFFERED="1")
    child = pexpect.spawn(sys.executable, [*CLI[1:], "chat", "-m", str(target_path), "-md", str(draft_path),
                                           "-n", "400", "--temp", "0"], env=env, encoding="utf-8", timeout=120)
    child.expect_exact(">>> ")
    return child


@pytest.mark.slow
def test_chat_session(target_path, draft_paths):
    child = spawn_chat(target_path, draft_paths["disagreeing"])
    child.sendline("/?")
    child.expect("Commands:")
    child.expect_exact(">>> ")
    child.sendline("/set max-tokens 16")
    child.expect_exact("(max-tokens set)")
    child.sendline("Say hello.")
    # (with a draft that rarely agrees, a calibrated sampled reply may draft nothing: no "drafted")
    child.expect(r"\[\d+ tokens, [\d.]+ tok/s, speculative, arbiter target( \| drafted \d+)?")
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


@pytest.mark.slow
def test_chat_ctrl_c_stops_reply_then_keeps_the_conversation(target_path, draft_paths):
    child = spawn_chat(target_path, draft_paths["disagreeing"])
    child.sendline("Write a very long story about the sea.")
    child.expect_exact("the sea.\r\n")  # the echoed input
    child.expect(r"\w+ \w+ \w+ \w+")  # the reply is streaming
    child.kill(signal.SIGINT)
    child.expect_exact("[reply stopped]")
    child.expect(r"\[\d+ tokens, [\d.]+ tok/s, speculative.*stop: aborted\]")  # what was produced, still counted
    child.expect_exact(">>> ")
    child.sendline("/set max-tokens 8")
    child.sendline("Thanks.")  # the conversation goes on
    child.expect(r"tok/s")
    child.expect_exact(">>> ")
    child.kill(signal.SIGINT)  # at the prompt: a hint, and the conversation stays
    child.expect_exact("Use Ctrl-D or /bye to exit.")
    child.expect_exact(">>> ")
    child.sendline("/show")
    child.expect(r"conversation: [1-9]\d* messages")  # the stopped reply's exchange and this one
    child.expect_exact(">>> ")
    child.sendeof()  # Ctrl-D leaves
    child.expect(pexpect.EOF)
    assert "Traceback" not in child.before
    child.close()
    assert (child.exitstatus, child.signalstatus) == (0, None)


def test_models_lists_named_models(tmp_path):
    env = dict(os.environ, COSPEC_LOCAL_CACHE=str(tmp_path))
    out = run_cli("models", "--json", env=env)
    assert out.returncode == 0, out.stderr
    rows = {r["name"]: r for r in json.loads(out.stdout)}
    target, truncated = rows["smollm2-135m"], rows["smollm2-135m-first4"]
    assert target["architecture"] == "llama" and target["vocabulary"] == 49152 and target["quantization"] == "Q4_1"
    # listing makes nothing: the derived draft is named with the path it will have, and not built
    assert "architecture" not in truncated and str(tmp_path) in truncated["path"]
    assert not list(tmp_path.glob("*.gguf"))
    distilled = rows["smollm2-135m-draft"]
    assert distilled["layers"] == 2 and distilled["vocabulary"] == 49152 and distilled["quantization"] == "Q8_0"
    demo_target, demo_draft = rows["demo-target"], rows["demo-draft"]
    assert demo_target["architecture"] == demo_draft["architecture"] == "llama"
    assert demo_target["vocabulary"] == demo_draft["vocabulary"] == 512
    assert demo_target["layers"] > demo_draft["layers"]


def test_chat_with_the_learned_arbiter_colours_kept_tokens():
    """`chat --arbiter demo-lora --color`, greedy and unpenalised, on the demo pair: the arbiter keeps a draft token on this
    problem (found by its recorded decisions), shown in magenta, and the answer stays right."""
    from cospec_local.tasks import load_task

    problem = load_task("arith", "test", 2)[1]
    env = dict(os.environ, TERM="dumb", PYTHONUNBUFFERED="1")
    child = pexpect.spawn(sys.executable, [*CLI[1:], "chat", "--arbiter", "demo-lora", "--color", "-t", "1", "--temp", "0", "--repeat-penalty", "1"], env=env,
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


@pytest.mark.slow
def test_gguf_header_reader_matches_the_gguf_package(target_path, draft_paths, tmp_path):
    """`models` reads only the header keys it shows; the values are those of the gguf package's
    full reader, and a damaged header is a ValueError."""
    import gguf

    from cospec_local.models import demo_model, describe_gguf, read_gguf_header

    for path in (target_path, draft_paths["disagreeing"], demo_model("target")):
        reader = gguf.GGUFReader(path, "r")
        arch = reader.get_field("general.architecture").contents()
        described = describe_gguf(Path(path))
        assert described["architecture"] == arch
        assert described["layers"] == reader.get_field(f"{arch}.block_count").contents()
        assert described["vocabulary"] == len(reader.get_field("tokenizer.ggml.tokens").data)
        assert described["tokenizer"] == reader.get_field("tokenizer.ggml.model").contents()
        assert described["quantization"] == gguf.LlamaFileType(
            reader.get_field("general.file_type").contents()).name.removeprefix("MOSTLY_")
        keys = {"general.name", f"{arch}.context_length", f"{arch}.rope.freq_base"}
        assert read_gguf_header(Path(path), keys) == {k: reader.get_field(k).contents() for k in keys
                                                       if reader.get_field(k) is not None}
    data = Path(demo_model("target")).read_bytes()
    for cut in (3, 30, 2000):
        broken = tmp_path / f"cut{cut}.gguf"
        broken.write_bytes(data[:cut])
        with pytest.raises(ValueError):
            describe_gguf(broken)


@pytest.mark.slow
def test_a_target_alone_gets_a_draft_with_its_vocabulary_or_runs_target_only(target_path, tmp_path):
    """`-m` without `-md`: generate, chat and serve load a bundled draft only where it is measured to
    pay, else draft with the n-gram drafter alone; bench and eval, which measure a pair, take the
    bundled draft made for a named target, a smaller named model with the target's vocabulary for
    a file, else decode with the target alone; each said in one line."""
    import gguf

    from cospec_local.formats.gguf_edit import open_gguf, rewrite_gguf
    from cospec_local.models import demo_model

    env = dict(os.environ, COSPEC_LOCAL_CACHE=str(tmp_path))
    out = run_cli("generate", "-m", "smollm2-135m", "-p", "The capital of France is", "-n", 4, "-t", 1, env=env)
    assert out.returncode == 0 and "the n-gram drafter drafts; -md DRAFT adds a draft model" in out.stderr
    assert "note: draft" not in out.stderr  # its distilled draft does not pay on a CPU
    out = run_cli("generate", "-m", "smollm2-135m-as-1b", "-p", "The capital of France is", "-n", 4, "-t", 1, env=env)
    assert out.returncode == 0 and "note: draft smollm2-135m-draft: the bundled draft made for" in out.stderr
    out = run_cli("bench", "-m", target_path, "-n", 4, "-t", 1, "--runs", "target-only", "--n-prompts", 1,
                  "--task", "arith", env=env)
    assert out.returncode == 0 and "note: draft smollm2-135m-draft: a smaller named model" in out.stderr, out.stderr
    # a vocabulary nobody else has (another BOS id): the target alone, said once
    lonely = rewrite_gguf(open_gguf(demo_model("target")), tmp_path / "lonely.gguf",
                          kv_edit=lambda key, value: 3 if key == gguf.Keys.Tokenizer.BOS_ID else value)
    out = run_cli("generate", "-m", lonely, "-p", "1 + 2 =", "-n", 4, "-t", 1, "--json", env=env)
    assert out.returncode == 0, out.stderr
    stats = json.loads(out.stdout)["stats"]
    assert json.loads(out.stdout)["mode"] == "speculative" and stats["draft_n"] == stats["draft_n_ngram"]
    out = run_cli("bench", "-m", lonely, "-n", 4, "-t", 1, "--runs", "target-only", "--n-prompts", 1,
                  "--task", "arith", env=env)
    assert "decoding with the target alone" in out.stderr, out.stderr
    # an incompatible pair says how to fix it; a wrong name lists the names and the closest one
    out = run_cli("generate", "-m", "smollm2-135m", "-md", "demo-draft", "-p", "Hi", "-n", 2, env=env)
    assert out.returncode == 1 and "do not write each other's texts" in out.stderr
    assert "fix: -md with a draft whose tokenizer writes any text" in out.stderr
    out = run_cli("generate", "-m", "smollm-135m", "-p", "Hi", "-n", 2, env=env)
    assert out.returncode == 1 and "did you mean 'smollm2-135m'?" in out.stderr and "demo-target" in out.stderr


def chat_on_demo(lines, n_ctx=1024, **settings):
    """A ChatSession on the demo pair fed `lines`, writing to a string (not a terminal)."""
    import io

    from cospec_local import Engine, GenerationParams
    from cospec_local.chat.session import ChatSession

    feed = iter(lines)

    def read_line(prompt):
        try:
            return next(feed)
        except StopIteration:
            raise EOFError from None

    out = io.StringIO()
    engine = Engine.open_default(n_ctx=n_ctx, n_threads=1)
    session = ChatSession(engine, GenerationParams(**settings), color=True, read_line=read_line, out=out)
    return engine, session, out


def test_chat_commands_validate_show_save_and_load(tmp_path):
    saved = tmp_path / "talk.json"
    engine, session, out = chat_on_demo(["/set temp -1", "/show", "1 + 2 =", f"/save {saved}", "/clear",
                                         f"/load {saved}", f"/load {tmp_path / 'missing.json'}"],
                                        max_tokens=24, arbiter="demo-lora")
    with engine:
        session.run()
    text = out.getvalue()
    assert "temp: temperature: must be a finite number >= 0" in text and "(temp set)" not in text
    assert "target: " in text and "draft:  " in text and "arbiter: demo-lora" in text and "temperature = 0.0" in text
    assert "(conversation saved to" in text and "(conversation loaded: 2 messages)" in text
    assert "is not a saved conversation" in text
    assert [m["role"] for m in session.messages] == ["user", "assistant"]
    assert json.loads(saved.read_text())["messages"] == session.messages
    assert "\x1b[" not in text  # --color writes no escape codes where the output is not a terminal


@pytest.mark.slow
def test_chat_drops_the_oldest_turns_when_the_context_fills(target_path, draft_paths):
    """SmolLM2's template renders the whole conversation: a small context fills within a few turns,
    and the oldest turns go (the system message stays) instead of an error."""
    import io

    from cospec_local import Engine, GenerationParams
    from cospec_local.chat.session import ChatSession

    messages = iter([f"Tell me one fact about the number {n}, in a sentence." for n in range(8)])
    out = io.StringIO()
    with Engine(target_path, draft_paths["disagreeing"], n_ctx=256, n_threads=1) as engine:
        session = ChatSession(engine, GenerationParams(max_tokens=40, ignore_eos=True), system="Be brief.",
                              read_line=lambda prompt: next(messages), out=out)
        try:
            session.run()
        except StopIteration:
            pass
        text = out.getvalue()
        assert "oldest turn" in text and "error" not in text
        assert text.count("tok/s") == 8  # every message got its reply
        assert len(session.messages) < 16 and session.messages[-1]["role"] == "assistant"
        assert len(engine.render_chat(session.conversation())) <= 256


def test_bench_table_shows_the_spread_and_flags_noise():
    from dataclasses import replace

    from cospec_local.evaluation.bench import BenchReport, markdown_table

    row = dict(draft_max=4, run="sps", tokens=96, seconds=0.96, tokens_per_second=100.0, speedup_bound=None,
               acceptance_rate=0.5, mean_accepted_per_block=1.0, arbiter_keeps=0, arbiter_share=0.0,
               arbiter_ms_per_call=None, overhead_fraction=0.1, prompts_identical_to_target=2)
    report = BenchReport.from_json(dict(
        target="t", draft="d", c=0.2, prompts=2, max_tokens=16, repeat=3, draft_p_min=0.0, adaptive_draft=True,
        temperature=0.0, seed=0, costs=None, other_load=0.0,
        results=[dict(row, speedup=1.05, speedup_per_repeat=[0.82, 1.02, 1.42], noisy=True),
                 dict(row, run="fly", speedup=1.30, speedup_per_repeat=[1.25, 1.3, 1.36], noisy=False)]))
    assert BenchReport.from_json(report.to_json()) == report  # bench.json reads back as the report
    table = markdown_table(report)
    assert "| 4 | sps | 100.0 | 1.05x (0.82-1.42) noisy |" in table
    assert "| 4 | fly | 100.0 | 1.30x (1.25-1.36) |" in table
    assert "noisy: half the range of the repeats' speed-ups" in table
    assert "repeat(s), greedy, adaptive block length;" in table
    for column in ("speed-up", "bound", "acceptance", "arbiter time", "outside llama.cpp", "same as target"):
        assert f"**{column}**" in table  # every column is explained under the table
    sampled = markdown_table(replace(report, temperature=0.7, seed=5))
    assert "repeat(s), temperature 0.7, seed 5, adaptive" in sampled and "greedy" not in sampled


def test_chat_in_a_terminal_samples_by_default_and_validates_settings(tmp_path):
    """The REPL through a pseudo-terminal, as a user meets it: chat's sampling defaults, /set
    refusing a bad value at once, /save and /load of the conversation."""
    saved = tmp_path / "talk.json"
    env = dict(os.environ, TERM="dumb", PYTHONUNBUFFERED="1")
    child = pexpect.spawn(sys.executable, [*CLI[1:], "chat", "-n", "40", "-t", "1"], env=env, encoding="utf-8",
                          timeout=120)
    child.expect_exact("The demo pair knows only")
    child.expect_exact(">>> ")
    child.sendline("/set temp -1")
    child.expect_exact("temp: temperature: must be a finite number >= 0")
    child.expect_exact(">>> ")
    child.sendline("/show")
    for line in ("arbiter: auto (demo-lora", "min_p = 0.05", "repeat_last_n = 64", "repeat_penalty = 1.1",
                 "temperature = 0.8", "top_k = 40", "top_p = 0.95"):
        child.expect_exact(line)
    child.expect_exact(">>> ")
    child.sendline("/set min-p 0.1")
    child.expect_exact("(min-p set)")
    child.sendline("Tom has 3 apples and buys 4 more. How many apples does Tom have now?")
    child.expect(r"\[\d+ tokens, [\d.]+ tok/s, speculative, arbiter demo-lora")
    child.expect_exact(">>> ")
    child.sendline(f"/save {saved}")
    child.expect_exact("(conversation saved to")
    child.sendline("/clear")
    child.expect_exact("(conversation cleared)")
    child.sendline(f"/load {saved}")
    child.expect_exact("(conversation loaded: 2 messages)")
    child.sendline("/bye")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    turns = json.loads(saved.read_text())["messages"]
    assert [m["role"] for m in turns] == ["user", "assistant"] and turns[1]["content"].strip()


@pytest.mark.slow
def test_gpu_flags_warn_once_on_a_cpu_build():
    from cospec_local import _cospec

    out = run_cli("generate", "-p", "1 + 2 =", "-n", 4, "-ngl", 99, "-ngld", 99)
    assert out.returncode == 0, out.stderr
    warned = out.stderr.count("-ngl/-ngld ignored: this llama.cpp build has no GPU backend")
    assert warned == (0 if _cospec.supports_gpu_offload() else 1)
    # the default (-1, all layers) asks for nothing, so says nothing
    assert "ignored" not in run_cli("generate", "-p", "1 + 2 =", "-n", 4).stderr
    for flags, named in ((("-c", 8), "'-c' / '--ctx-size'"), (("-n", -5), "'-n' / '--n-predict'"),
                         (("--draft-max", 0), "'--draft-max'"), (("--repeat-penalty", 0), "'--repeat-penalty'"),
                         (("-ngld", -2), "'-ngld' / '--gpu-layers-draft'")):
        bad = run_cli("generate", "-p", "x", *flags)
        assert bad.returncode == 2 and named in bad.stderr and "target:" not in bad.stderr, flags


QA_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"


def test_chat_template_override_replaces_the_models_own(target_path, tmp_path):
    """--chat-template-file (llama-cli's flag) renders chat prompts with the user's template: the
    prompt the target reads is that template's text, not SmolLM2's ChatML."""
    from cospec_local import Engine

    with Engine(target_path, n_ctx=256, chat_template=QA_TEMPLATE) as engine:
        assert engine.render_chat([{"role": "user", "content": "Hi"}]) == engine.tokenize("user: Hi\nassistant:")
        expected_n = len(engine.tokenize("user: Hi\nassistant:"))
    with Engine(target_path, n_ctx=256) as engine:
        own_n = len(engine.render_chat([{"role": "user", "content": "Hi"}]))
    assert own_n != expected_n
    template_file = tmp_path / "qa.jinja"
    template_file.write_text(QA_TEMPLATE)
    out = run_cli("generate", "-m", target_path, "--mode", "target-only", "--chat", "-p", "Hi", "-n", 1, "--json",
                  "--chat-template-file", template_file)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["stats"]["prompt_n"] == expected_n


def test_a_broken_chat_template_is_refused_at_start(target_path):
    out = run_cli("generate", "-m", target_path, "--mode", "target-only", "--chat", "-p", "Hi", "-n", 1,
                  "--chat-template", "{% for m in messages %}{{ m['content'] }")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "the chat template does not compile" in out.stderr
    both = run_cli("generate", "-m", target_path, "-p", "Hi", "--chat-template", "chatml",
                   "--chat-template-file", __file__)
    assert both.returncode == 2 and "not both" in both.stderr


@pytest.mark.slow
def test_llama_cli_flags_read_whole_and_prompts_read_as_llama_cli_reads_them(target_path, tmp_path):
    """-sys is a system prompt, not -s 'ys'; an unknown multi-letter flag is refused by its whole
    name; -f drops the file's last newline as llama-cli does, and -p - reads standard input."""
    base = ["generate", "-m", target_path, "--mode", "target-only", "-n", 8, "--temp", 0, "-t", 1]

    def tokens(*args, **kw):
        out = run_cli(*base, *args, "--json", **kw)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    text = "The sky is blue because"
    by_flag = tokens("-p", text)["tokens"]
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text(text + "\n")
    assert tokens("-f", prompt_file)["tokens"] == by_flag
    assert tokens("-p", "-", input=text + "\n")["tokens"] == by_flag
    assert tokens("-f", "-", input=text + "\n")["tokens"] == by_flag

    system = "Answer in French, in one short sentence, and never use English words. " * 4
    alone = tokens("-p", "hello", "--chat")["stats"]["prompt_n"]  # with the template's own default system message
    with_system = tokens("-p", "hello", "-sys", system)["stats"]["prompt_n"]  # -sys implies --chat
    assert with_system > alone + 40

    shown = run_cli(*base, "-p", text)
    hidden = run_cli(*base, "-p", text, "--no-display-prompt", "--jinja")
    assert shown.returncode == hidden.returncode == 0, hidden.stderr
    assert shown.stdout.startswith(text) and not hidden.stdout.startswith(text)
    assert shown.stdout[len(text):] == hidden.stdout

    for command, flag in (("generate", "-xyz"), ("chat", "-ctxz"), ("eval", "-sys")):
        out = run_cli(command, flag, "1")
        assert out.returncode == 2 and f"No such option '{flag}'" in out.stderr, out.stderr
    out = run_cli("generate", "-cnv", "-p", "hi")
    assert out.returncode == 2 and "a conversation is `cospec-local chat`" in out.stderr
    out = run_cli("generate", "-m", target_path, "-p", "hi", "-n16", "--mode", "target-only", "-t", 1, "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["stats"]["predicted_n"] <= 16  # a short flag's value still joins it


@pytest.mark.slow
def test_generate_json_labels_each_decision():
    from cospec_local.tasks import load_task

    question = load_task("arith", "test", 1)[0].prompt
    out = run_cli("generate", "-p", question, "--arbiter", "demo-features", "-n", 96, "-t", 1, "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["decisions"], "the demo pair parts ways on an arithmetic problem: the arbiter decides"
    for d in data["decisions"]:
        assert set(d) == {"block", "position", "token_index", "p_keep", "keep"}
        assert 0.0 <= d["p_keep"] <= 1.0 and isinstance(d["keep"], bool)
        assert data["provenance"][d["token_index"]] == ("kept" if d["keep"] else "fallback")


@pytest.mark.slow
def test_an_arbiter_name_given_as_a_path_is_told_to_drop_the_path(tmp_path):
    out = run_cli("generate", "-p", "1 + 1 =", "--arbiter", "./demo-features", "-n", 4, "-t", 1, cwd=tmp_path)
    assert out.returncode == 1 and "'demo-features' is an arbiter's name: give it without a path" in out.stderr


def test_auto_never_picks_fly(target_path, draft_paths):
    """FLy keeps mismatches without knowing whether the draft is right: a task mode, never auto's
    choice (on open chat it can turn a reply to another subject)."""
    from cospec_local.arbiter.catalog import NAMED_ARBITERS, resolve_auto
    from cospec_local.models import resolve_model

    for draft in (resolve_model("demo-draft"), target_path, *draft_paths.values(), None):
        assert resolve_auto(draft) in ("target", *NAMED_ARBITERS)
    assert resolve_auto(resolve_model("demo-draft")) == "demo-lora"


@pytest.mark.slow
def test_n_minus_one_generates_until_the_context_ends(target_path):
    """llama-cli's -n -1: no limit but the end of text and the context (the engine's own)."""
    out = run_cli("generate", "-m", target_path, "-c", 64, "-n", -1, "--ignore-eos", "--mode", "target-only",
                  "-t", 1, "-p", "Once upon a time", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["stats"]["prompt_n"] + data["stats"]["predicted_n"] == 64


@pytest.mark.slow
def test_an_over_long_prompt_is_refused_before_anything_is_printed_and_a_cut_context_is_said():
    long_prompt = "one two three four five six seven eight nine ten " * 80
    out = run_cli("generate", "-p", long_prompt, "-n", 4, "-t", 1)
    assert out.returncode == 1 and out.stdout == "", out.stdout[:200]
    assert "tokens but the context holds 512" in out.stderr
    out = run_cli("generate", "-p", "1 + 1 =", "-n", 4, "-t", 1, "-c", 100000)
    assert out.returncode == 0, out.stderr
    assert "-c 100000 is more than the models were trained for: the context holds 512 tokens" in out.stderr
    quiet = run_cli("generate", "-p", "1 + 1 =", "-n", 4, "-t", 1)
    assert "more than the models were trained for" not in quiet.stderr  # only where -c asked for it
