"""The Python API: results, stats, provenance, streaming, stop strings and
OpenAI-style chat completions, on the real engine."""
import dataclasses

import pytest

from cospec_local import Arbiter, Engine, _cospec, arbiter_from_function

SPEC_PROVENANCE = {"match", "kept", "fallback", "bonus"}


# The draft model alone drafts (spec_type "draft"): with the lossless arbiter the default also runs
# the n-gram drafter, whose pool holds the engine's earlier replies, so what it proposes here would
# depend on the tests that ran before.
RUNS = {"sps": dict(mode="speculative", arbiter="target", spec_type="draft"),
        "fly": dict(mode="speculative", arbiter="fly", spec_type="draft"),
        "target-only": dict(mode="target-only"), "draft-only": dict(mode="draft-only")}


@pytest.mark.parametrize("mode", list(RUNS))
@pytest.mark.slow
def test_stats_add_up(engine_for, mode):
    engine = engine_for("mixed")
    r = engine.generate("Explain how photosynthesis works in simple terms.", max_tokens=48, draft_max=4,
                        ignore_eos=True, fly_window=2, adaptive_draft=False, **RUNS[mode])
    s = r.stats
    assert s.predicted_n == len(r.tokens) == len(r.provenance) == 48
    assert s.draft_n_matched + s.arbiter_keeps + s.target_fallbacks + s.bonus + s.plain == s.predicted_n
    counts = {p: r.provenance.count(p) for p in set(r.provenance)}
    assert counts.get("match", 0) == s.draft_n_matched and counts.get("kept", 0) == s.arbiter_keeps
    assert counts.get("fallback", 0) == s.target_fallbacks and counts.get("bonus", 0) == s.bonus
    if mode in ("sps", "fly"):
        # a block needs room for a draft token and the target's token after it: when one token of
        # the budget is left, the step is a plain target step (where blocks end decides whether
        # that happens, and it does with some CPUs' rounding)
        assert set(r.provenance[:-1]) <= SPEC_PROVENANCE and r.provenance[-1] in SPEC_PROVENANCE | {"target"}
        assert s.plain == r.provenance.count("target") <= 1
        assert s.draft_n >= s.draft_n_matched + s.arbiter_keeps
        # one target token (fallback or bonus) ends every block
        assert s.target_fallbacks + s.bonus == s.blocks
        assert s.draft_n <= 4 * s.blocks and s.blocks_ngram == 0
        j = r.stats.to_json()
        assert j["draft_n_accepted"] == s.draft_n_matched + s.arbiter_keeps and j["predicted_n"] == 48
    else:
        assert s.plain == 48 and s.blocks == 0 and s.draft_n == 0
        assert set(r.provenance) == {"target" if mode == "target-only" else "draft"}
    if mode == "sps":
        assert s.arbiter_keeps == 0 and s.arbiter_calls == 0 and r.decisions == []
        assert r.label == "speculative/target"
    if mode == "fly":
        assert r.label == "speculative/fly"
        # every decision the walk applied is recorded; the kept ones are the kept tokens
        kept = [d for d in r.decisions if d.keep]
        assert [d.token_index for d in kept] == [i for i, p in enumerate(r.provenance) if p == "kept"]
        rejected = [d.token_index for d in r.decisions if not d.keep]
        assert rejected == [i for i, p in enumerate(r.provenance) if p == "fallback"]


@pytest.mark.slow
def test_stats_attributes_are_the_json_keys(engine):
    """Python and JSON (`generate --json`, the server's `timings`) name the stats alike: every key
    of to_json() is an attribute or property of Stats with that value (times rounded to the
    microsecond in JSON), and every field is in it. prompt_n + cache_n is the prompt's length."""
    first = engine.tokenize("Explain how photosynthesis works in simple terms.")
    second = engine.tokenize("Explain how photosynthesis works in simple terms. Be brief.")
    runs = [(first, engine.generate(first, max_tokens=24, ignore_eos=True, arbiter="fly", adaptive_draft=False)),
            (second, engine.generate(second, max_tokens=8, mode="target-only"))]  # reuses the first's cache
    for prompt, r in runs:
        s, j = r.stats, r.stats.to_json()
        assert set(j) >= {f.name for f in dataclasses.fields(s)}
        for key, value in j.items():
            assert hasattr(type(s), key), key
            assert type(value) is type(getattr(s, key)), key
            if isinstance(value, float):
                assert value == pytest.approx(getattr(s, key), abs=5e-4), key
            else:
                assert value == getattr(s, key), key
        assert s.predicted_n == len(r.tokens) and s.draft_n_accepted == s.draft_n_matched + s.arbiter_keeps
        assert s.prompt_n + s.cache_n == len(prompt) and s.prompt_n >= 1
    assert runs[0][1].stats.draft_n > 0 and runs[1][1].stats.cache_n > 0


def test_steps_that_draft_nothing_are_not_blocks(engine):
    """With adaptive drafting a weak draft gets K = 0 steps: plain target steps, not blocks."""
    r = engine.generate("Explain how photosynthesis works in simple terms.", max_tokens=64, ignore_eos=True)
    s = r.stats
    assert s.plain > 0, "the disagreeing draft should make the tuner skip drafting"
    assert s.plain == r.provenance.count("target")
    assert s.target_fallbacks + s.bonus == s.blocks
    assert s.draft_n_matched + s.arbiter_keeps + s.target_fallbacks + s.bonus + s.plain == s.predicted_n


def test_a_draft_that_declines_every_token_leads_to_plain_steps():
    """--draft-p-min cuts a block where the draft is unsure. A draft that declines every token
    must bring adaptive drafting to plain target steps (a declined block counts as one that
    ended early), not a draft call and a one-token verify per token forever; and the acceptance
    learned under one p-min is not carried into a call with another."""
    with Engine.open_default(n_ctx=512, n_threads=1) as engine:  # a pair where drafting pays
        prompt = "What is 37 - 19?"
        engine.generate(prompt, max_tokens=64, ignore_eos=True, spec_type="draft")
        declined = engine.generate(prompt, max_tokens=128, ignore_eos=True, draft_p_min=1.0, spec_type="draft")
        s = declined.stats
        assert s.plain > s.predicted_n / 2, f"{s.blocks} blocks drafted {s.draft_n} tokens"
        # Back at p-min 0 the pair drafts again within the first exploring interval (16 steps);
        # with the declined run's estimate kept, the next exploration would be 48 steps away.
        again = engine.generate(prompt, max_tokens=24, ignore_eos=True, spec_type="draft")
        assert again.stats.draft_n > 0


def test_python_arbiter_sees_the_block(engine):
    seen = []

    def keep_all(block):
        k = block["n_draft"]
        assert block["draft"].shape == (k,) and block["target"].shape == (k + 1,)
        assert block["target_logits"].shape == (k + 1, engine._native.n_vocab)
        assert block["draft_logits"].shape[0] == k
        assert (block["mismatch"] == (block["draft"] != block["target"][:k])).all()
        seen.append(int(block["mismatch"].sum()))
        return [True] * k

    r = engine.generate("The capital of France is", mode="speculative", arbiter=arbiter_from_function(keep_all, "keep-all"),
                        max_tokens=30, draft_max=4, ignore_eos=True, adaptive_draft=False)
    assert seen and r.mode == "speculative" and r.arbiter == "keep-all"
    # keeping every mismatch: no fallback, every block ends with a bonus token
    assert r.stats.target_fallbacks == 0 and r.stats.arbiter_keeps == r.provenance.count("kept") > 0
    assert r.stats.arbiter_calls == len(seen)


def test_stream_matches_generate(engine):
    prompt = "Write a short story about a robot who learns to paint."
    full = engine.generate(prompt, max_tokens=40, ignore_eos=True)
    events = list(engine.stream(prompt, max_tokens=40, ignore_eos=True))
    assert "".join(e.text for e in events) == full.text
    assert [e.token for e in events if e.token >= 0] == full.tokens
    assert engine.last_result.tokens == full.tokens


def test_stop_string_across_tokens(engine):
    prompt = "The capital of France is"
    free = engine.generate(prompt, max_tokens=24, ignore_eos=True).text
    assert "United States" in free
    cut = free.index("United St")
    stopped = engine.generate(prompt, max_tokens=24, ignore_eos=True, stop=["United St"])
    assert stopped.stop_reason == "stop_string" and stopped.finish_reason == "stop"
    assert stopped.text == free[:cut]
    streamed = "".join(e.text for e in engine.stream(prompt, max_tokens=24, ignore_eos=True, stop=["United St"]))
    assert streamed == stopped.text


def test_chat_template_from_gguf(engine):
    tokens = engine.render_chat([{"role": "user", "content": "Hi"}])
    text = engine.detokenize(tokens)
    assert engine._native.token_text(tokens[0]) == "<|im_start|>"
    assert "user\nHi" in text


def test_chat_completion(engine):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    out = engine.create_chat_completion(messages, max_tokens=32)
    assert out["object"] == "chat.completion"
    choice = out["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"].strip()
    # greedy sps through the chat path says exactly what the target alone says
    alone = engine.create_chat_completion(messages, max_tokens=32, mode="target-only")
    assert alone["choices"][0]["message"]["content"] == choice["message"]["content"]
    assert choice["finish_reason"] in ("stop", "length")
    assert out["usage"]["completion_tokens"] == out["timings"]["predicted_n"]

    chunks = list(engine.create_chat_completion(messages, max_tokens=32, stream=True))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert content == choice["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == choice["finish_reason"]


def test_engine_context_manager_closes(target_path):
    with Engine(target_path) as engine:
        assert engine.generate("Hi", mode="target-only", max_tokens=2, ignore_eos=True).tokens
    with pytest.raises(Exception, match="closed"):
        engine.generate("Hi", mode="target-only", max_tokens=2)


def test_arbiter_error_keeps_partial_output(engine):
    calls = []

    def fail_later(block):
        calls.append(1)
        if len(calls) > 3:
            return "not a list of decisions"
        return [False] * block["n_draft"]

    with pytest.raises(ValueError):
        engine.generate("Tell me about the sea.", mode="speculative", arbiter=arbiter_from_function(fail_later),
                        max_tokens=64, ignore_eos=True, adaptive_draft=False)
    assert len(calls) == 4
    partial = engine.last_result
    assert partial.stop_reason == "error" and 0 < len(partial.tokens) < 64
    assert engine.generate("Hi", max_tokens=2, ignore_eos=True).tokens


def test_one_copy_of_ggml_per_process():
    """The extension links the llama.cpp that llama-cpp-python installed: using both
    in one process must not load a second ggml."""
    import subprocess
    import sys

    code = ("import cospec_local._cospec, llama_cpp\n"
            "libs = {l.split()[-1] for l in open('/proc/self/maps') if '/libggml' in l}\n"
            "print('\\n'.join(sorted(libs)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    libs = out.stdout.split()
    for name in ("libggml-base.so", "libggml-cpu.so", "libggml.so"):
        assert len([p for p in libs if p.split("/")[-1].startswith(name)]) == 1, libs


@pytest.mark.parametrize("text", ["Hello world", "  two leading spaces", "naïve café, 3.14\nnew line", "日本語"])
def test_tokenize_round_trip(engine, text):
    assert engine.detokenize(engine.tokenize(text, add_special=False)) == text


def test_cost_model_settings_steer_timing_free_block_lengths():
    """With an arbiter that can keep, block lengths come from acceptance counts and the cost model
    (--draft-cost, --verify-cost): cheap verification drafts long blocks, dear verification short
    ones, and the same settings give the same tokens."""
    from cospec_local.errors import InvalidArgumentError
    from cospec_local.tasks import load_task

    prompt = load_task("arith", "test", 1)[0].prompt
    with Engine.open_default(n_ctx=1024, n_threads=1) as engine:
        cheap = engine.generate(prompt, arbiter="fly", max_tokens=96, draft_cost=0.01, verify_cost=0.0)
        dear = engine.generate(prompt, arbiter="fly", max_tokens=96, draft_cost=0.5, verify_cost=3.0)
        assert cheap.stats.draft_n / max(1, cheap.stats.blocks) > 4
        assert dear.stats.plain > cheap.stats.plain
        again = engine.generate(prompt, arbiter="fly", max_tokens=96, draft_cost=0.01, verify_cost=0.0)
        assert again.tokens == cheap.tokens
        with pytest.raises(InvalidArgumentError, match="draft_cost"):
            engine.generate(prompt, arbiter="fly", draft_cost=float("nan"))


def test_each_arbiter_reports_its_kind():
    """Built-in and callback arbiters are the kind they are made as; a learned one is the kind its
    arbiter.gguf names, which the file spells as the kind's name."""
    assert [Arbiter.target().kind, Arbiter.fly().kind, arbiter_from_function(lambda block: []).kind] == \
        [_cospec.ARBITER_TARGET, _cospec.ARBITER_FLY, _cospec.ARBITER_CALLBACK]
    with Engine.open_default(n_ctx=512, n_threads=1) as demo:
        for name, kind in (("demo-lora", _cospec.ARBITER_LORA), ("demo-features", _cospec.ARBITER_FEATURES)):
            arbiter = demo.arbiter(name)
            assert arbiter.kind == kind
            assert _cospec.arbiter_kind_name(arbiter.kind) == arbiter.meta("kind")


def test_auto_arbiter_is_the_bundled_one_for_its_draft_else_the_target(engine):
    from cospec_local.arbiter.catalog import NAMED_ARBITERS

    assert engine.generate("Hi", arbiter="auto", max_tokens=4).arbiter == "target"  # no arbiter for this draft
    with Engine.open_default(n_ctx=512, n_threads=1) as demo:
        first = next(a.name for a in NAMED_ARBITERS.values() if a.draft == "demo-draft")
        assert demo.generate("1 + 2 =", arbiter="auto", max_tokens=4).arbiter == first


def test_every_native_status_has_its_python_error():
    """cospec.h's status codes and the Python error classes agree: each code's class carries it and
    the name the C library gives it (cospec_status_name: COSPEC_ERR_ARBITER_DRAFT -> "arbiter_draft")."""
    import re
    from pathlib import Path

    from cospec_local.errors import _BY_STATUS

    header = (Path(__file__).resolve().parents[1] / "native" / "include" / "cospec.h").read_text()
    codes = {int(value): _cospec.status_name(int(value))
             for value in re.findall(r"COSPEC_ERR_\w+\s*=\s*(-\d+)", header)}
    assert codes.pop(-99) == "internal"  # a bug, raised as plain CospecError
    assert "unknown" not in codes.values() and _cospec.status_name(-1000) == "unknown"
    assert {status: cls.status_name for status, cls in _BY_STATUS.items()} == codes
