"""Every architecture llama.cpp runs, as target and as draft: tiny random models of 15 families
(attention, sliding window, mixture of experts, recurrent, hybrid) made by llama.cpp's own
converter (cospec_local/formats/tiny_models.py), all with SmolLM2's vocabulary. Greedy speculative
decoding must give the target's own tokens whatever the draft proposes, and a memory that cannot
drop a tail must roll back from its saved state, not by decoding the context again."""
from __future__ import annotations

from pathlib import Path

import pytest

from cospec_local import Engine
from cospec_local.formats import tiny_models

REPO = Path(__file__).resolve().parents[1]
ARCHS = list(tiny_models.ARCHITECTURES)
RECURRENT_OR_HYBRID = [a for a, kind in tiny_models.ARCHITECTURES.items() if "recurrent" in kind or "hybrid" in kind]
# Past the sliding window of the zoo's gemma3 and gpt-oss (32 tokens), so rollbacks cross it.
PROMPT = ("Speculative decoding lets a small draft model propose a block of tokens that the large target "
          "model checks in one batched pass; where they disagree, the target's token is taken and the block "
          "ends. The text here only has to be long enough to pass a short sliding window.")
N_PREDICT = 40


@pytest.fixture(scope="session")
def zoo() -> dict[str, Path]:
    return tiny_models.build(ARCHS, tiny_models.cache_dir(REPO))  # a later run reuses them


def other_than(arch: str) -> str:
    """A zoo model of another family: its proposals almost never agree with arch's."""
    return "qwen3" if arch != "qwen3" else "llama"


def generate(engine: Engine, **params):
    return engine.generate(PROMPT, max_tokens=N_PREDICT, **params)


@pytest.mark.parametrize("arch", ARCHS)
def test_each_architecture_loads_and_speculates_losslessly_as_target(zoo, arch):
    with Engine(zoo[arch], zoo[other_than(arch)], n_ctx=512) as engine:
        reference = generate(engine, mode="target-only")
        assert reference.stats.predicted_n == N_PREDICT
        assert len(set(reference.tokens)) > 5, "a random model that repeats one token tests no rollback"
        for k in (1, 4, 8):
            result = generate(engine, draft_max=k, adaptive_draft=False, spec_type="draft")
            assert result.tokens == reference.tokens, f"K={k}"
            s = result.stats
            assert s.draft_n > 0 and s.target_fallbacks > 0  # the draft proposed and was refused
            # Each block decodes its K + 1 tokens and, after a rollback, the tokens it accepted:
            # a memory that decoded the context again would pass this bound many times over.
            assert s.target_decoded <= 2 * (s.draft_n + s.blocks) + s.plain, f"K={k}"
            if arch in RECURRENT_OR_HYBRID:
                assert s.restored > 0, f"K={k}"
        fly = generate(engine, arbiter="fly", draft_max=8, adaptive_draft=False)
        assert fly.stats.predicted_n == N_PREDICT and fly.stats.blocks > 0
        # The n-gram drafter on the same memory: a prompt that holds the other family's reply to
        # itself makes it propose that reply again, which the target refuses; its refusals roll
        # back as the draft model's do.
        echo = PROMPT + generate(engine, mode="draft-only").text + "\n" + PROMPT
        reference = engine.generate(echo, max_tokens=N_PREDICT, mode="target-only")
        ngram = engine.generate(echo, max_tokens=N_PREDICT, spec_type="ngram", adaptive_draft=False)
        assert ngram.tokens == reference.tokens
        s = ngram.stats
        assert s.blocks_ngram > 0 and s.draft_n_ngram > s.draft_n_matched_ngram  # proposed, and refused
        if arch in RECURRENT_OR_HYBRID:
            assert s.restored > 0


@pytest.mark.parametrize("arch", ARCHS)
def test_each_architecture_drafts_for_itself_and_for_another_target(zoo, arch):
    with Engine(zoo[arch], zoo[arch], n_ctx=512) as engine:
        reference = generate(engine, mode="target-only")
        result = generate(engine, draft_max=4, adaptive_draft=False, spec_type="draft")
        assert result.tokens == reference.tokens
        assert result.stats.acceptance_rate > 0.9
    with Engine(zoo[other_than(arch)], zoo[arch], n_ctx=512) as engine:
        reference = generate(engine, mode="target-only")
        result = generate(engine, draft_max=4, adaptive_draft=False, spec_type="draft")
        assert result.tokens == reference.tokens
        s = result.stats
        assert s.draft_decoded <= 2 * (s.draft_n + s.blocks) + s.plain
        if arch in RECURRENT_OR_HYBRID:
            assert s.restored > 0


def test_a_hybrid_rollback_decodes_only_the_accepted_tokens(zoo):
    """Counted exactly on a long prompt: no decode grows with the context."""
    with Engine(zoo["falconh1"], zoo["qwen3"], n_ctx=2048) as engine:
        prompt = PROMPT * 12
        n_prompt = len(engine.tokenize(prompt))
        reference = engine.generate(prompt, max_tokens=N_PREDICT, mode="target-only")
        result = engine.generate(prompt, max_tokens=N_PREDICT, draft_max=4, adaptive_draft=False, spec_type="draft")
    assert result.tokens == reference.tokens
    s = result.stats
    assert n_prompt > 500 and s.restored > 0
    # Per block: [last, d1..d4] to verify; after a restore, [last, accepted...] again; every
    # generated token but the first is some block's fallback or bonus.
    assert s.target_decoded <= 2 * (s.draft_n + s.blocks) + s.plain < n_prompt


def test_head_drafters_carry_llama_cpps_mtp_layer_and_eagle3_head():
    """qwen35-mtp is qwen35 plus one multi-token-prediction layer under the names llama.cpp's MTP
    drafter loads; as a plain target the layer is skipped and it is qwen35, logit for logit.
    llama-eagle3 is an EAGLE-3 head for llama: three of llama's layers in, llama's vocabulary;
    qwen35-eagle3 the same for the hybrid qwen35."""
    import gguf
    import numpy as np

    names = ["qwen35", "llama", *tiny_models.HEAD_DRAFTERS]
    models = tiny_models.build(names, tiny_models.cache_dir(REPO))  # the zoo fixture reuses qwen35 and llama
    readers = {n: gguf.GGUFReader(models[n]) for n in names}

    def key(name, k):
        return readers[name].fields[k].contents()

    def tensors(name):
        return {t.name: t for t in readers[name].tensors}

    n, h = tiny_models.LAYERS, tiny_models.HIDDEN
    mtp, trunk = tensors("qwen35-mtp"), tensors("qwen35")
    assert key("qwen35-mtp", "general.architecture") == "qwen35"
    assert key("qwen35-mtp", "qwen35.nextn_predict_layers") == 1
    assert key("qwen35-mtp", "qwen35.block_count") == n + 1
    assert key("qwen35-mtp", "qwen35.attention.recurrent_layers")[n] is False  # the MTP layer attends
    assert list(mtp[f"blk.{n}.nextn.eh_proj.weight"].shape) == [2 * h, h]
    assert {f"blk.{n}.nextn.{t}.weight" for t in ("enorm", "hnorm", "shared_head_norm")} | \
        {f"blk.{n}.{t}.weight" for t in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_up")} <= set(mtp)
    assert set(mtp) - set(trunk) == {t for t in mtp if t.startswith(f"blk.{n}.")}
    assert all(np.array_equal(mtp[t].data, trunk[t].data) for t in trunk)

    head, target = tensors("llama-eagle3"), tensors("llama")
    assert key("llama-eagle3", "general.architecture") == "eagle3"
    assert key("llama-eagle3", "eagle3.block_count") == 1
    assert key("llama-eagle3", "eagle3.target_layers") == tiny_models.EAGLE3_TARGET_LAYERS
    assert len(set(tiny_models.EAGLE3_TARGET_LAYERS)) == 3 and max(tiny_models.EAGLE3_TARGET_LAYERS) < n
    assert key("llama-eagle3", "eagle3.target_hidden_size") == key("llama", "llama.embedding_length")
    assert list(head["fc.weight"].shape) == [3 * h, h]
    assert list(head["blk.0.attn_q.weight"].shape) == [2 * h, h]  # [token embedding, fused state]
    assert "blk.0.attn_norm_2.weight" in head and "d2t" not in head
    assert list(head["output.weight"].shape) == list(target["output.weight"].shape)
    assert key("llama-eagle3", "tokenizer.ggml.tokens") == key("llama", "tokenizer.ggml.tokens")
    # qwen35-eagle3 reads the hybrid qwen35: its layers 1 and 3 attend, layer 2 is recurrent.
    assert key("qwen35-eagle3", "general.architecture") == "eagle3"
    assert key("qwen35-eagle3", "eagle3.target_layers") == tiny_models.EAGLE3_TARGET_LAYERS
    assert key("qwen35-eagle3", "eagle3.target_hidden_size") == key("qwen35", "qwen35.embedding_length")
    assert [key("qwen35", "qwen35.attention.recurrent_layers")[i] for i in tiny_models.EAGLE3_TARGET_LAYERS] == \
        [False, True, False]

    with Engine(models["qwen35-mtp"], None, n_ctx=512, n_threads=1, calibration=None) as with_mtp, \
            Engine(models["qwen35"], None, n_ctx=512, n_threads=1, calibration=None) as plain:
        prompt = with_mtp.tokenize(PROMPT)
        assert np.array_equal(with_mtp.score(prompt), plain.score(prompt))
        result = generate(with_mtp, mode="target-only")
        assert result.stats.predicted_n == N_PREDICT and len(set(result.tokens)) > 5
        assert result.tokens == generate(plain, mode="target-only").tokens


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


@pytest.mark.slow
def test_gemma3_270m_rolls_back_past_its_sliding_window(zoo):
    """The real Gemma 3 270M (a 512-token window) with a prompt past the window, and a draft of its
    vocabulary that disagrees almost everywhere: every rollback crosses the window's edge.

    Verify batches multiply Gemma's Q4_K weights with other CPU kernels than one-token steps
    (docs/lossless-output.md): on an AVX-512 CPU from 9 tokens on, on an AVX2 one from 2. Where
    they do, the output may leave target-only's at a near-tie, where the batch's rounding picks the
    target's second choice; wherever the batches agree, it is the same token for token."""
    import numpy as np

    from cospec_local.model_paths import find_gemma3_gguf

    gemma = find_gemma3_gguf(REPO / ".cache" / "models")
    draft = tiny_models.build(["llama"], REPO / ".cache" / "tiny-models" / "gemma3-vocab", vocab=gemma)["llama"]
    prompt = "Summarise the following notes in one sentence.\n" + "\n".join(
        f"Note {i}: the shipment of {i * 7 % 23 + 2} crates left warehouse {i % 5} on day {i}." for i in range(40))
    for drafter in (draft, gemma):
        # (fixed blocks: no calibration to measure, which costs Gemma pairs seconds on a fresh machine;
        # plain kernels, whose verify batches round as the near-tie rule above says: repacked ones
        # round others, test_weight_repacking.py)
        with Engine(gemma, drafter, n_ctx=1024, calibration=None, repack=False) as engine:
            prompt_tokens = engine.tokenize(prompt)
            assert len(prompt_tokens) > 600
            reference = engine.generate(prompt, max_tokens=48, mode="target-only")
            for k in (1, 4, 8):
                result = engine.generate(prompt, max_tokens=48, draft_max=k, adaptive_draft=False, spec_type="draft")
                at = first_difference(result.tokens, reference.tokens)
                if at is None:
                    continue
                row = engine.score(prompt_tokens + reference.tokens[:at])[-1]
                top2 = np.sort(row)[-2:]
                assert result.tokens[at] == int(np.argsort(row)[-2]) and top2[1] - top2[0] < 0.5, f"K={k}"
            if drafter == draft:
                assert result.stats.target_fallbacks > 0
