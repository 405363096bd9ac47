"""Greedy speculative decoding with the `target` arbiter is lossless: token for
token the same as target-only decoding, whatever the draft and K, where llama.cpp's batched
product rounds as its one-token product does (SmolLM2's Q4_1 on CPU with flash attention on:
the engines of the identity tests below); and what holds on every backend and setting (the
default turns flash attention off for a small model on a CPU, whose batched attention then
rounds otherwise): the tokens it emits are the verify pass's greedy choices."""
import pytest
from conftest import engines_by_draft

from cospec_local import Engine

PROMPTS = [
    "The capital of France is",
    "Explain how photosynthesis works in simple terms.",
    "def fibonacci(n):\n",
    "List three colours:\n1.",
]
N_TOKENS = 32


@pytest.fixture(scope="module")
def exact_engine_for(target_path, draft_paths):
    """exact_engine_for(kind) -> an Engine with that draft at the default flash attention: on
    (llama.cpp's choice) for a target of SmolLM2's size, where batched and one-token passes round
    alike. So these tests also hold the default to exactness there."""
    yield from engines_by_draft(target_path, draft_paths)


@pytest.fixture(scope="module")
def reference(exact_engine_for):
    cache = {}

    def get(kind, prompt):
        if (kind, prompt) not in cache:
            r = exact_engine_for(kind).generate(prompt, mode="target-only", max_tokens=N_TOKENS, ignore_eos=True)
            assert r.provenance == ["target"] * N_TOKENS
            cache[kind, prompt] = r.tokens
        return cache[kind, prompt]

    return get


def test_default_flash_attention_follows_the_models_size(target_path, draft_paths):
    """Off for a model under FLASH_ATTN_CPU_OFF_MAX_PARAMS parameters on the CPU (the demo pair,
    a 2-block SmolLM2), whose verify batches its kernel makes dear; llama.cpp's choice for
    SmolLM2-135M itself and for offloaded layers; -fa wins over both."""
    from cospec_local import _cospec

    small = "auto" if _cospec.supports_gpu_offload() else "off"  # layers offloaded by default there
    with Engine.open_default(n_ctx=256) as demo:
        assert (demo.flash_attn("target"), demo.flash_attn("draft")) == (small, small)
    with Engine(target_path, draft_paths["disagreeing"], n_ctx=256) as smol:
        assert (smol.flash_attn("target"), smol.flash_attn("draft")) == ("auto", small)
    with Engine(target_path, n_ctx=256, flash_attn="off") as forced:
        assert forced.flash_attn("target") == "off" and forced.flash_attn("draft") is None
    with Engine(target_path, draft_paths["disagreeing"], n_ctx=256, flash_attn="on") as forced:
        assert (forced.flash_attn("target"), forced.flash_attn("draft")) == ("on", "on")


@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("kind", ["disagreeing", "mixed", "self"])
@pytest.mark.slow
def test_sps_matches_target_only(exact_engine_for, reference, kind, k):
    engine = exact_engine_for(kind)
    totals = {"match": 0, "fallback": 0, "bonus": 0, "target": 0}  # target: the last token, when no room is left to draft
    for prompt in PROMPTS:
        r = engine.generate(prompt, mode="speculative", spec_type="draft", max_tokens=N_TOKENS, draft_max=k, ignore_eos=True,
                            adaptive_draft=False)
        assert r.tokens == reference(kind, prompt), f"sps diverged from target-only ({kind} draft, K={k}): {prompt!r}"
        assert r.stop_reason == "max_tokens"
        for p in r.provenance:
            totals[p] += 1
    if kind == "self":
        # A target drafting for itself always agrees: no fallback ever.
        assert totals["fallback"] == 0 and totals["match"] > 0
    elif kind == "disagreeing":
        assert totals["fallback"] > totals["match"]
    else:
        # Partial blocks: matches followed by a rollback, and whole blocks with a bonus.
        assert totals["match"] > 0 and totals["fallback"] > 0 and totals["bonus"] > 0


@pytest.mark.slow
def test_prompt_cache_does_not_change_output(exact_engine_for, reference):
    """The second call reuses the cached prompt prefix; results must not change."""
    engine = exact_engine_for("disagreeing")
    prompt = PROMPTS[1]
    engine.reset()
    first = engine.generate(prompt, mode="speculative", spec_type="draft", max_tokens=N_TOKENS, draft_max=4, ignore_eos=True, adaptive_draft=False)
    again = engine.generate(prompt, mode="speculative", spec_type="draft", max_tokens=N_TOKENS, draft_max=4, ignore_eos=True, adaptive_draft=False)
    assert first.stats.cache_n == 0 and again.stats.cache_n > 0
    assert first.tokens == again.tokens == reference("disagreeing", prompt)


@pytest.mark.parametrize("kind", ["disagreeing", "mixed"])
@pytest.mark.slow
def test_adaptive_draft_length_is_lossless_and_backs_off(exact_engine_for, reference, kind):
    """Adaptive drafting picks each block's length in [0, K]; output stays the target's,
    and a draft that rarely agrees gets short blocks (often none)."""
    engine = exact_engine_for(kind)
    fixed_drafted = adaptive_drafted = 0
    for prompt in PROMPTS:
        fixed = engine.generate(prompt, mode="speculative", spec_type="draft", max_tokens=N_TOKENS, draft_max=8, ignore_eos=True,
                                adaptive_draft=False)
        adaptive = engine.generate(prompt, mode="speculative", spec_type="draft", max_tokens=N_TOKENS, draft_max=8, ignore_eos=True,
                                   adaptive_draft=True)
        assert adaptive.tokens == fixed.tokens == reference(kind, prompt)
        assert adaptive.stats.draft_n <= 8 * adaptive.stats.blocks
        fixed_drafted += fixed.stats.draft_n
        adaptive_drafted += adaptive.stats.draft_n
    if kind == "disagreeing":
        assert adaptive_drafted < fixed_drafted / 3


@pytest.mark.parametrize("weight_type", ["Q8_0", "Q4_0"])
@pytest.mark.slow
def test_zero_ffn_blocks_keep_the_function(target_path, model_dir, reference, weight_type):
    """A target made costlier by zero feed-forward blocks (the realistic-size benchmark's models)
    computes the source's function exactly: the same greedy tokens, alone and verifying the
    source drafting for it."""
    import gguf

    from cospec_local.formats.gguf_edit import add_ffn_blocks, architecture, block_count, open_gguf

    path = add_ffn_blocks(target_path, model_dir / f"plus2-{weight_type}.gguf", 2, 512,
                          gguf.GGMLQuantizationType[weight_type])
    reader = open_gguf(path)
    assert (architecture(reader), block_count(reader)) == ("deci", 32)
    assert reader.get_field("deci.feed_forward_length").contents() == [1536] * 30 + [512] * 2
    with Engine(path, target_path, n_ctx=512) as costly:
        for prompt in PROMPTS:
            alone = costly.generate(prompt, mode="target-only", max_tokens=N_TOKENS, ignore_eos=True)
            verified = costly.generate(prompt, mode="speculative", spec_type="draft", max_tokens=N_TOKENS, draft_max=4, ignore_eos=True,
                                       adaptive_draft=False)
            assert alone.tokens == verified.tokens == reference("self", prompt)
            assert verified.stats.target_fallbacks == 0


@pytest.mark.parametrize("pair", ["mixed", "demo"])
@pytest.mark.slow
def test_blocks_with_a_mismatch_emit_the_verify_passs_choices(request, pair):
    """The invariant that holds on every backend: in each block with a mismatch (the blocks an
    arbiter sees), the tokens sps emits are the target's greedy choices at their positions in that
    block's verify pass: the accepted draft tokens, then the target's token at the mismatch.
    Identity with one-token decoding needs more, the batched product rounding as the one-token
    product does (SmolLM2's Q4_1 on CPU with flash attention on, above); the demo pair's Q8_0 goes through llama.cpp's
    tiled product on CPU and through other kernels on a GPU, where this still holds. The GPU check
    runs it (scripts/gpu_check.sh)."""
    import numpy as np

    from cospec_local.arbiter.callbacks import arbiter_from_function
    from cospec_local.engine import Engine
    from cospec_local.tasks import load_task

    blocks = []

    def record(block):  # keeps nothing: the target arbiter's walk
        blocks.append({"context": block["context"].tolist(), "draft": block["draft"].tolist(),
                       "target": block["target"].tolist(), "argmax": block["target_logits"].argmax(axis=1).tolist()})
        return np.zeros(block["n_draft"], dtype=np.float32)

    recorder = arbiter_from_function(record, "verify-record")
    if pair == "demo":
        engine = Engine.open_default(n_ctx=1024, n_threads=2)
        prompts = [p.prompt for f in ("arith", "pyfunc") for p in load_task(f, "test", 3)]
        n_tokens = 128  # the demo draft agrees with its target through most answers' first lines
    else:
        engine, prompts = request.getfixturevalue("engine_for")(pair), PROMPTS  # needs SmolLM2 (the demo pair does not)
        n_tokens = N_TOKENS
    try:
        n_blocks = n_accepted = 0
        for prompt in prompts:
            blocks.clear()
            engine.reset()
            r = engine.generate(prompt, mode="speculative", spec_type="draft", arbiter=recorder, max_tokens=n_tokens, draft_max=4,
                                adaptive_draft=False, ignore_eos=True)
            sequence = engine.tokenize(prompt) + list(r.tokens)
            for b in blocks:
                assert b["target"] == b["argmax"]  # the block's target tokens are its verify pass's greedy choices
                n = len(b["context"])
                assert sequence[:n] == b["context"]
                m = next(i for i, (d, t) in enumerate(zip(b["draft"], b["target"])) if d != t)
                emitted = sequence[n:n + m + 1]
                assert emitted == b["target"][:len(emitted)]  # shorter only where the generation ended
                n_accepted += m
            n_blocks += len(blocks)
        assert n_blocks >= len(prompts) and n_accepted > 0
    finally:
        if pair == "demo":
            engine.close()
