"""A draft of another family (native/src/text_bridge.cpp, the text path of generate.cpp): Gemma 3
270M and SmolLM2-135M, each drafting for the other. The output is the target's (greedy: its very
tokens; sampling: its distribution), characters split across tokens included; what needs the
draft's own tokens at the target's positions is refused with the reason."""
from __future__ import annotations

from pathlib import Path

import pytest

from cospec_local import Engine, InvalidArgumentError, arbiter_from_function
from cospec_local.models import resolve_model

REPO = Path(__file__).resolve().parents[1]
CHAT = [q for q in (REPO / "bench" / "heldout_chat_prompts.txt").read_text().splitlines() if q.strip()]
RAW = ["The capital of France is", "def add(a, b):\n    return", "List three colors:\n1."]


# Gemma 3 as the target runs llama.cpp's plain CPU kernels here: there one-token steps and verify
# batches of up to 8 tokens round alike, so any difference from target-only is a fault of the loop.
# Its repacked Q4_K kernels (the default) round near ties otherwise at any block length
# (test_weight_repacking.py counts those).
PLAIN_KERNELS = {"repack": False}


@pytest.fixture(scope="module", params=["gemma3-target", "smollm2-target"])
def pair(request):
    """Each way round; Gemma 3's GGUF carries no chat template, so its turn markers are given by name."""
    gemma, smollm2 = resolve_model("gemma3-270m"), resolve_model("smollm2-135m")
    if request.param == "gemma3-target":
        engine = Engine(gemma, smollm2, n_ctx=1024, n_threads=2, chat_template="gemma", **PLAIN_KERNELS)
    else:
        engine = Engine(smollm2, gemma, n_ctx=1024, n_threads=2, draft_chat_template="gemma")
    with engine:
        yield engine


def draft_alone(pair, **options):
    """The pair's draft model opened as a target on its own, in its own chat format."""
    gemma_draft = "gemma" not in (pair.model_desc("target") or "").lower()
    return Engine(resolve_model("gemma3-270m" if gemma_draft else "smollm2-135m"), n_ctx=1024, n_threads=2,
                  chat_template="gemma" if gemma_draft else None, **options)


def incomplete_pieces(engine, tokens) -> int:
    """Tokens whose text is part of a UTF-8 character (a character split across tokens)."""
    return sum("\ufffd" in engine.detokenize([t]) for t in tokens)


def test_the_pair_drafts_through_text_and_says_why(pair):
    assert "tokenizer type differs" in pair.vocab_difference


def assert_targets_output(engine, prompt, drafted, plain, draft_max):
    """The drafted output is target-only's; but verify batches of 9 or more tokens multiply Gemma's
    Q4_K weights with other CPU kernels than one-token steps (docs/lossless-output.md), so at K = 8
    on a Gemma target it may leave target-only's at a near-tie: two of the target's likeliest
    tokens within half a logit, as scored."""
    import numpy as np

    at = next((i for i, (x, y) in enumerate(zip(drafted.tokens, plain.tokens)) if x != y), None)
    if at is None:
        assert drafted.tokens == plain.tokens and drafted.text == plain.text
        return
    assert draft_max >= 8 and "gemma" in engine.model_desc("target").lower(), f"K={draft_max}: differs at {at}"
    prompt_tokens = list(prompt) if not isinstance(prompt, str) else engine.tokenize(prompt)
    row = engine.score(prompt_tokens + plain.tokens[:at])[-1]
    assert row.max() - row[drafted.tokens[at]] < 0.5 and row.max() - row[plain.tokens[at]] < 0.5
    assert len(np.flatnonzero(row > row.max() - 0.5)) >= 2


@pytest.mark.parametrize("prompt", RAW)
def test_greedy_output_is_the_targets(pair, prompt):
    plain = pair.generate(prompt, mode="target-only", max_tokens=32)
    for draft_max in (1, 4, 8):
        drafted = pair.generate(prompt, spec_type="draft", max_tokens=32, adaptive_draft=False, draft_max=draft_max)
        assert_targets_output(pair, prompt, drafted, plain, draft_max)
        assert drafted.stats.blocks > 0 and drafted.used_draft_model


def test_a_text_block_is_as_long_as_its_length_in_target_tokens(pair):
    """A block's length counts the target's tokens, the unit its acceptance and verify costs count
    in: the draft writes as many of its own tokens as make k of the target's. In Russian SmolLM2
    writes about three tokens where Gemma writes one, so k of its own would be a third of k."""
    for k in (4, 8):
        run = pair.generate("Привет, как дела? Сегодня", spec_type="draft", max_tokens=64,
                            adaptive_draft=False, draft_max=k, ignore_eos=True)
        assert run.stats.blocks > 5
        assert (k - 1) * run.stats.blocks <= run.stats.draft_n <= k * run.stats.blocks


def test_characters_split_across_tokens_keep_the_output(pair):
    """'ꙮ' is three byte tokens in both vocabularies: the draft reads the reply without a
    character's first bytes until the target completes it, and its proposals must begin with them."""
    prompt = "ꙮ ꙮ ꙮ ꙮ ꙮ ꙮ ꙮ ꙮ"
    plain = pair.generate(prompt, mode="target-only", max_tokens=24)
    assert incomplete_pieces(pair, plain.tokens) >= 6  # the reply repeats the character
    drafted = pair.generate(prompt, spec_type="draft", max_tokens=24, adaptive_draft=False, draft_max=4)
    assert drafted.tokens == plain.tokens
    assert drafted.stats.draft_n_matched > 0  # proposals that ran through split characters were taken


@pytest.mark.slow
def test_greedy_output_is_the_targets_on_chat_prompts(pair):
    for question in CHAT[:5]:
        prompt = pair.render_chat([{"role": "user", "content": question}])
        plain = pair.generate(prompt, mode="target-only", max_tokens=48)
        drafted = pair.generate(prompt, spec_type="draft", max_tokens=48, adaptive_draft=False, draft_max=4)
        assert_targets_output(pair, prompt, drafted, plain, 4)


def test_sampling_is_reproducible_and_fly_decides_on_target_positions(pair):
    runs = [pair.generate("Once upon a time", spec_type="draft", max_tokens=24, temperature=0.8, seed=5,
                          adaptive_draft=False, draft_max=4) for _ in range(2)]
    assert runs[0].tokens == runs[1].tokens and runs[0].stats.blocks > 0
    fly = pair.generate("Once upon a time", spec_type="draft", max_tokens=24, arbiter="fly", adaptive_draft=False)
    assert fly.stats.blocks > 0 and fly.arbiter == "fly"


def test_an_arbiter_reads_the_draft_where_it_chose_its_own_token(pair):
    """Across vocabularies a block's draft tokens are the target's tokens of the draft's text; an
    arbiter that reads the draft gets, at each position, the draft's distribution where it chose
    its own token holding that position's first byte (draft_own), and the draft's token for the
    target's text where it begins there (draft_alt): the features of a same-vocabulary block."""
    import numpy as np

    from cospec_local import _cospec, _cospec_internals

    seen = []

    def record(block):
        seen.append({k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in block.items()})
        return [0.0] * block["n_draft"]

    prompt = pair.render_chat(MESSAGES)
    plain = pair.generate(prompt, mode="target-only", max_tokens=32)
    r = pair.generate(prompt, spec_type="draft", max_tokens=32, adaptive_draft=False, draft_max=4,
                      draft_prompt=pair.render_draft_chat(MESSAGES), arbiter=arbiter_from_function(record, "reads-draft"))
    assert r.tokens == plain.tokens and seen  # an arbiter that keeps nothing leaves the target's output
    texts = _cospec_internals.TextBridge(pair.target_path, pair.draft_path)  # each vocabulary's pieces
    for block in seen:
        k = block["n_draft"]
        own, alt, rows = block["draft_own"], block["draft_alt"], block["draft_logits"]
        assert own.shape == alt.shape == (k,) and rows.shape[0] == k
        features = _cospec.block_features(block)
        log_softmax = rows - np.log(np.exp(rows - rows.max(1, keepdims=True)).sum(1, keepdims=True)) - rows.max(1, keepdims=True)
        expected = np.maximum(log_softmax[np.arange(k), own], -30.0)
        assert np.allclose(features[:, 5], expected, atol=1e-3)  # draft_logp_draft: its own token there
        for i in range(k):
            if alt[i] >= 0:  # where the target's token begins with the draft's own: its first draft token
                piece = pair._native.token_to_piece(int(block["target"][i])).decode("utf-8", errors="replace")
                first = pair.tokenize(piece, add_special=False, parse_special=False, which="draft")[:1]
                assert [int(alt[i])] == first
                # ...and the block's token there and the draft's own begin at the same byte.
                ours, theirs = texts.text([int(block["draft"][i])], True), texts.text([int(own[i])], False)
                assert ours.startswith(theirs) or theirs.startswith(ours)


@pytest.mark.slow
def test_a_features_arbiter_runs_and_a_lora_arbiter_is_refused_with_the_reason(tmp_path):
    """Arbiters made for SmolLM2-135M drafting for Gemma 3 270M: a features arbiter (an untrained
    head at threshold 0, so that it keeps every mismatch it is asked about) decides on the text
    path, the same way each time; the LoRA arbiter, which runs the draft model over the target's
    tokens, is refused, naming what runs instead."""
    pytest.importorskip("torch")
    from cospec_local.arbiter.file_format import write_arbiter
    from cospec_local.train.arbiter_model import FeaturesArbiter, LoraArbiter, load_draft_backbone

    from cospec_local import _cospec
    from cospec_local.arbiter.evaluations import describe_arbiter, details_text

    smollm2, gemma = resolve_model("smollm2-135m"), resolve_model("gemma3-270m")
    target = {"fingerprint": _cospec.model_fingerprint(str(gemma)), "file": gemma.name}
    features = write_arbiter(tmp_path / "features", kind="features", head=FeaturesArbiter().head, draft_gguf=smollm2,
                             threshold=0.0, name="test-features", target=target)
    # Its record names both models: the draft it reads and the target its states came from.
    details = details_text(describe_arbiter(features))
    assert f"draft       {smollm2.name}" in details and f"target      {gemma.name} (fingerprint {target['fingerprint'][:16]})" in details
    lora = LoraArbiter(load_draft_backbone(smollm2)).eval()
    lora_folder = write_arbiter(tmp_path / "lora", kind="lora", head=lora.head, draft_gguf=smollm2, threshold=0.5,
                                name="test-lora", **lora.export_args())
    with Engine(gemma, smollm2, n_ctx=512, n_threads=2, chat_template="gemma", **PLAIN_KERNELS) as engine:
        prompt = engine.render_chat(MESSAGES)
        runs = [engine.generate(prompt, spec_type="draft", max_tokens=32, arbiter=str(features), draft_max=4,
                                draft_prompt=engine.render_draft_chat(MESSAGES)) for _ in range(2)]
        assert runs[0].tokens == runs[1].tokens
        assert runs[0].stats.arbiter_keeps > 0 and "kept" in runs[0].provenance
        with pytest.raises(InvalidArgumentError, match="runs the draft model over the target's tokens, which a draft "
                                                       "of another vocabulary cannot read .* use a features arbiter"):
            engine.generate(prompt, spec_type="draft", max_tokens=4, arbiter=str(lora_folder))


def test_draft_only_decoding_reads_the_prompt_in_the_drafts_tokens(pair):
    """The draft alone writes what it writes as a target on its own engine: the prompt's text
    read in its own tokens."""
    alone = pair.generate("The capital of France is", mode="draft-only", max_tokens=16)
    with draft_alone(pair) as engine:
        own = engine.generate("The capital of France is", mode="target-only", max_tokens=16)
    assert alone.text == own.text


MESSAGES = [{"role": "system", "content": "Answer in one sentence."},
            {"role": "user", "content": "What is the capital of Peru?"}]


def test_a_draft_reads_a_chat_in_its_own_format(pair):
    """render_draft_chat is the conversation as the draft model alone renders it (SmolLM2's own
    template, or Gemma's turn markers given by name), in the draft's tokens."""
    with draft_alone(pair) as engine:
        assert pair.render_draft_chat(MESSAGES) == engine.render_chat(MESSAGES)
        alone = engine.generate(engine.render_chat(MESSAGES), mode="target-only", max_tokens=16)
    draft_prompt = pair.render_draft_chat(MESSAGES)
    # Draft-only decoding in the draft's own format writes what the draft alone writes...
    only = pair.generate(pair.render_chat(MESSAGES), mode="draft-only", max_tokens=16, draft_prompt=draft_prompt)
    assert only.text == alone.text
    # ...and text given for it is read with the draft's tokenizer, special tokens included.
    with draft_alone(pair) as engine:
        text = engine.detokenize(engine.render_chat(MESSAGES), render_special=True)
    again = pair.generate(pair.render_chat(MESSAGES), mode="draft-only", max_tokens=16, draft_prompt=text)
    assert again.text == alone.text


def test_speculation_with_the_drafts_own_format_keeps_the_targets_output(pair):
    prompt, draft_prompt = pair.render_chat(MESSAGES), pair.render_draft_chat(MESSAGES)
    plain = pair.generate(prompt, mode="target-only", max_tokens=32)
    for draft_max in (1, 4):
        drafted = pair.generate(prompt, spec_type="draft", max_tokens=32, adaptive_draft=False, draft_max=draft_max,
                                draft_prompt=draft_prompt)
        assert_targets_output(pair, prompt, drafted, plain, draft_max)
        assert drafted.stats.blocks > 0


def test_a_served_chat_reaches_the_draft_in_its_own_format(pair):
    from cospec_local.params import GenerationParams
    from cospec_local.server.workers import prepare_prompt

    prepared = prepare_prompt(pair, True, (MESSAGES, None), GenerationParams())
    assert prepared.tokens == pair.render_chat(MESSAGES)
    assert prepared.draft_tokens == pair.render_draft_chat(MESSAGES) is not None
    assert prepare_prompt(pair, False, "Hello", GenerationParams()).draft_tokens is None


def test_a_draft_of_the_targets_vocabulary_reads_the_targets_tokens():
    with Engine("smollm2-135m", "smollm2-135m-draft", n_ctx=256, n_threads=2, draft_chat_template="gemma") as engine:
        assert engine.vocab_difference is None and engine.render_draft_chat(MESSAGES) is None


@pytest.mark.slow
def test_sampled_drafting_keeps_the_targets_distribution(pair):
    """At temperature > 0 each proposed token is accepted with the target's probability of it and
    a refusal samples the rest: the first two tokens are distributed as target-only's."""
    from collections import Counter

    from scipy.stats import chi2_contingency

    prompt = "My favourite animal is the"
    counts = {"target-only": Counter(), "speculative": Counter()}
    proposed = 0
    for mode, seeds in (("target-only", range(300)), ("speculative", range(10_000, 10_300))):
        for seed in seeds:
            r = pair.generate(prompt, mode=mode, spec_type="draft", max_tokens=2, temperature=1.0, seed=seed,
                              ignore_eos=True, adaptive_draft=False, draft_max=2)
            counts[mode][tuple(r.tokens)] += 1
            proposed += r.stats.draft_n > 0
    assert proposed > 250
    a, b = counts["target-only"], counts["speculative"]
    assert len(a) >= 5, "the prompt should spread probability over several continuations"
    common = [k for k in set(a) | set(b) if a[k] + b[k] >= 10]
    rows = [[c[k] for k in common] + [sum(c.values()) - sum(c[k] for k in common)] for c in (a, b)]
    assert chi2_contingency(rows)[1] > 1e-3


def test_arbiter_train_for_such_a_pair_trains_the_features_arbiter(tmp_path):
    """`arbiter train` with a draft of another vocabulary trains the features arbiter alone (saying
    so where the LoRA one was asked for too), and stops with the reason where only the LoRA arbiter
    or GRPO (which starts from it) was asked for."""
    from cospec_local.train.arbiter_recipe import RecipeRun, RecipeSettings, RecipeStop

    said = []
    run = RecipeRun(RecipeSettings(name="x", target="gemma3-270m", draft="smollm2-135m"), tmp_path, tmp_path,
                    say=said.append)
    assert run.across_vocabularies("tokenizer type differs").kinds == ("features",)
    assert said and "the LoRA arbiter cannot read the target's tokens; training the features arbiter only" in said[0]
    with pytest.raises(RecipeStop, match="use --kinds features"):
        RecipeRun(RecipeSettings(name="x", kinds=("lora",)), tmp_path, tmp_path).across_vocabularies("d")
    with pytest.raises(RecipeStop, match="leave out --grpo"):
        RecipeRun(RecipeSettings(name="x", grpo=True), tmp_path, tmp_path).across_vocabularies("d")
