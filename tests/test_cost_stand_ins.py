"""Cost stand-ins: a real model followed by layers that add exactly zero, its function at a larger
model's per-token cost (gguf_edit.add_zero_layers; the named `gemma3-270m-as-2b`)."""
from __future__ import annotations

import numpy as np
import pytest

from cospec_local import Engine
from cospec_local.formats.gguf_edit import add_zero_layers, architecture, block_count, open_gguf
from cospec_local.models import demo_model, resolve_model

# Past Gemma 3's 512-token sliding window: its local layers then attend to part of the prompt only.
LONG_TEXT = " ".join(f"Item {i}: the {['red', 'green', 'blue'][i % 3]} box holds {i * 7 % 31} stones." for i in range(70))
QUESTIONS = ["What is the capital of France?", "Write a haiku about rain.", "def fibonacci(n):\n"]


@pytest.fixture(scope="module")
def gemma_with_zero_layers(tmp_path_factory):
    source = resolve_model("gemma3-270m")
    return source, add_zero_layers(source, tmp_path_factory.mktemp("stand-in") / "gemma3-plus3.gguf", 3)


@pytest.mark.slow
def test_zero_layers_keep_gemmas_function_past_its_window(gemma_with_zero_layers):
    source, padded = gemma_with_zero_layers
    reader = open_gguf(padded)
    assert (architecture(reader), block_count(reader)) == ("gemma3", 21)
    with Engine(source, None, n_ctx=1024, n_threads=2, calibration=None) as real, \
            Engine(padded, None, n_ctx=1024, n_threads=2, calibration=None) as stand_in:
        long_prompt = real.tokenize(LONG_TEXT + "\nWhich box holds the most stones?")
        assert len(long_prompt) > 600
        # Every logit of every position, the long prompt's included, bit for bit.
        assert np.array_equal(real.score(long_prompt), stand_in.score(long_prompt))
        for prompt in [long_prompt, *(real.render_chat([{"role": "user", "content": q}]) for q in QUESTIONS)]:
            alone = real.generate(prompt, mode="target-only", max_tokens=48, ignore_eos=True)
            padded_alone = stand_in.generate(prompt, mode="target-only", max_tokens=48, ignore_eos=True)
            assert padded_alone.tokens == alone.tokens


def test_zero_layers_are_refused_where_zero_is_not_known_to_add_nothing(tmp_path):
    with pytest.raises(ValueError, match="only for gemma3, not 'llama'"):
        add_zero_layers(demo_model("target"), tmp_path / "x.gguf", 2)
    with pytest.raises(ValueError, match="positive int"):
        add_zero_layers(demo_model("target"), tmp_path / "x.gguf", 0)
    assert not (tmp_path / "x.gguf").exists()


@pytest.mark.slow
def test_a_stand_in_never_gets_its_source_as_draft(monkeypatch, tmp_path):
    """Its source would agree on every token: bench and eval pick no draft for it rather than that one."""
    from cospec_local import models

    monkeypatch.setenv("COSPEC_LOCAL_CACHE", str(tmp_path))
    monkeypatch.setitem(models.GEMMA3_AT_COST, "2b", 1)  # the function is the same at any size
    stand_in = resolve_model("gemma3-270m-as-2b")
    assert block_count(open_gguf(stand_in)) == 19
    for target in ("gemma3-270m-as-2b", stand_in):  # by name or by its file
        draft, why = models.choose_draft(target, paying_only=False)
        assert draft != "gemma3-270m"
        assert draft is None and "shares the target's vocabulary" in why


@pytest.mark.slow
def test_widened_ffns_keep_smollm2s_function_and_its_heads_blocks(tmp_path):
    """`widen_ffn` gives every FFN zero channels in its own type: the logits are SmolLM2's bit for
    bit, and, since the layers an EAGLE-3 head reads are unchanged too, the head trained for SmolLM2
    drafts and is accepted on the widened model exactly as on SmolLM2."""
    from cospec_local import models
    from cospec_local.formats.gguf_edit import widen_ffn

    # The named stand-in is this at 20,224 channels (0.7 GB, and a 1B model's time per token):
    # the same construction at one more block of 256 tests it in a tenth of the time.
    assert models.SMOLLM2_WIDE_FFN == 20224 and models.smollm2_wide_path().name.endswith(".ffn20224.98362432.gguf")
    source = resolve_model("smollm2-135m")
    wide = widen_ffn(source, tmp_path / "wide.gguf", 1536 + 256)
    reader = open_gguf(wide)
    assert reader.get_field("llama.feed_forward_length").contents() == 1792
    assert {tuple(t.shape) for t in reader.tensors if t.name.endswith("ffn_down.weight")} == {(1792, 576)}
    with Engine(source, resolve_model("smollm2-135m-eagle3"), n_ctx=1024, n_threads=2, calibration=None) as real, \
            Engine(wide, resolve_model("smollm2-135m-eagle3"), n_ctx=1024, n_threads=2, calibration=None) as widened:
        long_prompt = real.tokenize(LONG_TEXT)
        assert np.array_equal(real.score(long_prompt), widened.score(long_prompt))
        for question in QUESTIONS:
            prompt = real.render_chat([{"role": "user", "content": question}])
            runs = [e.generate(prompt, spec_type="draft-eagle3", max_tokens=48, draft_max=3, adaptive_draft=False)
                    for e in (real, widened)]
            assert runs[0].tokens == runs[1].tokens
            assert runs[0].stats.draft_n_matched_head == runs[1].stats.draft_n_matched_head > 0
            assert runs[0].stats.draft_n_head == runs[1].stats.draft_n_head


def test_ffns_are_widened_only_where_zero_channels_are_known_to_add_nothing(tmp_path):
    from cospec_local.formats.gguf_edit import widen_ffn

    with pytest.raises(ValueError, match="only llama models can be widened, not 'gemma3'"):
        widen_ffn(resolve_model("gemma3-270m"), tmp_path / "x.gguf", 4096)
    with pytest.raises(ValueError, match="whole blocks of 256 channels \\(the model's 1536, asked 1552\\)"):
        widen_ffn(resolve_model("smollm2-135m"), tmp_path / "x.gguf", 1536 + 16)
    with pytest.raises(ValueError, match="above the model's 1536"):
        widen_ffn(resolve_model("smollm2-135m"), tmp_path / "x.gguf", 1024)
    assert not (tmp_path / "x.gguf").exists()


@pytest.mark.slow
def test_extra_blocks_in_a_q4_k_m_mix_keep_the_function_of_smollm2_in_q4_0(tmp_path):
    """SmolLM2 requantized by llama.cpp to Q4_0, then zero FFN blocks whose gate and up rows are
    Q4_0 and whose down projection is Q4_K or Q6_K by llama.cpp's Q4_K_M rule: the same greedy
    tokens, and weights only of those types (every one with repacked kernels on x86 but Q6_K)."""
    import gguf

    from cospec_local.formats.gguf_edit import add_ffn_blocks, q4_k_m_uses_more_bits

    source = resolve_model("smollm2-135m-q4_0")
    kinds = {t.tensor_type.name for t in open_gguf(source).tensors if len(t.shape) == 2}
    assert kinds == {"Q4_0", "Q8_0"}  # (its tied embedding and output falls back to Q8_0: 576-wide rows)
    padded = add_ffn_blocks(source, tmp_path / "q4-plus8.gguf", 8, 1024, gguf.GGMLQuantizationType.Q4_0,
                            down_type="q4_k_m")
    reader = open_gguf(padded)
    total = block_count(reader)
    downs = {int(t.name.split(".")[1]): t.tensor_type.name for t in reader.tensors
             if t.name.endswith("ffn_down.weight") and int(t.name.split(".")[1]) >= 30}
    assert len(downs) == 8 and total == 38
    assert downs == {i: "Q6_K" if q4_k_m_uses_more_bits(i, total) else "Q4_K" for i in downs}
    assert set(downs.values()) == {"Q4_K", "Q6_K"}
    with Engine(source, None, n_ctx=512, n_threads=2, calibration=None) as real, \
            Engine(padded, None, n_ctx=512, n_threads=2, calibration=None) as stand_in:
        for q in QUESTIONS:
            prompt = real.render_chat([{"role": "user", "content": q}])
            assert stand_in.generate(prompt, mode="target-only", max_tokens=32).tokens == \
                real.generate(prompt, mode="target-only", max_tokens=32).tokens
    with pytest.raises(ValueError, match="576 wide"):
        add_ffn_blocks(source, tmp_path / "bad.gguf", 1, 256, gguf.GGMLQuantizationType.Q4_K)
