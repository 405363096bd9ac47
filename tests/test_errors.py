"""Bad input gets a clear error, loses nothing, and leaves the process (and
the engine) working."""
import re
import threading
import time

import pytest

from cospec_local import (ContextFullError, Engine, InvalidArgumentError, ModelLoadError, NoDraftError,
                          VocabMismatchError, arbiter_from_function)
from cospec_local import _cospec
from gguf_fixtures import corrupt_vocab, truncate_file


def test_missing_file(target_path, tmp_path):
    with pytest.raises(ModelLoadError, match="file not found"):
        Engine(target_path, tmp_path / "nope.gguf")
    with pytest.raises(ModelLoadError, match="target model .* file not found"):
        Engine(tmp_path / "nope.gguf")


def test_non_gguf_file(target_path, tmp_path):
    junk = tmp_path / "notes.gguf"
    junk.write_text("this is not a model\n" * 100)
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        Engine(target_path, junk)


@pytest.mark.parametrize("n_bytes", [10, 4_000, 5_000_000])
def test_truncated_gguf(target_path, tmp_path, n_bytes):
    cut = truncate_file(target_path, tmp_path / f"cut-{n_bytes}.gguf", n_bytes)
    with pytest.raises(ModelLoadError, match="truncated|corrupt"):
        Engine(cut)


def test_directory_instead_of_file(tmp_path):
    with pytest.raises(ModelLoadError, match="not a regular file"):
        Engine(tmp_path)


@pytest.mark.slow
def test_a_draft_with_other_token_ids_drafts_through_text(target_path, draft_paths, tmp_path):
    # the same token texts under other ids: not the target's tokens, but the same texts
    swapped = corrupt_vocab(draft_paths["disagreeing"], tmp_path / "swapped-vocab.gguf")
    with Engine(target_path, swapped, n_ctx=256) as engine:
        assert "token texts differ, first at id 1000" in engine.vocab_difference
        plain = engine.generate("The capital of France is", mode="target-only", max_tokens=16)
        # (fixed blocks: this pair's calibrated costs say no adaptive length pays)
        drafted = engine.generate("The capital of France is", spec_type="draft", max_tokens=16, adaptive_draft=False,
                                  draft_max=4)
        assert drafted.tokens == plain.tokens and drafted.stats.blocks > 0


def test_a_draft_that_cannot_write_the_targets_texts_is_refused(target_path):
    from cospec_local.models import resolve_model

    # the demo draft's 512-token vocabulary writes arithmetic and Python, not every text
    with pytest.raises(VocabMismatchError, match=r"tokenizer type differs .* do not write each other's texts \("):
        Engine(target_path, resolve_model("demo-draft"))


def test_prompt_longer_than_context(target_path, draft_paths):
    with Engine(target_path, draft_paths["disagreeing"], n_ctx=64) as engine:
        long_prompt = "word " * 200
        for mode in ("speculative", "target-only"):
            with pytest.raises(ContextFullError, match="prompt: it has .* tokens but the context holds 64"):
                engine.generate(long_prompt, mode=mode, max_tokens=8)
        # Still usable afterwards.
        assert engine.generate("Hello", max_tokens=4, ignore_eos=True).tokens


@pytest.mark.slow
def test_context_filling_up_stops_cleanly(target_path, draft_paths):
    with Engine(target_path, draft_paths["disagreeing"], n_ctx=64) as engine:
        for run in (dict(mode="speculative"), dict(mode="target-only"), dict(mode="speculative", arbiter="fly")):
            r = engine.generate("Count to one hundred: 1, 2, 3,", max_tokens=500, ignore_eos=True, **run)
            assert r.stop_reason == "context_full"
            assert r.finish_reason == "length"
            assert r.prompt_tokens + len(r.tokens) <= 65
            assert len(r.tokens) > 40


@pytest.mark.parametrize("bad", [dict(draft_max=0), dict(draft_max=-3), dict(draft_max=_cospec.N_DRAFT_MAX + 1),
                                 dict(max_tokens=0),
                                 dict(temperature=-1.0), dict(top_p=0.0), dict(top_k=-1), dict(mode="nonsense"),
                                 dict(mode="sps"), dict(arbiter_threshold=1.5), dict(fly_window=0, arbiter="fly")])
def test_invalid_parameters(engine, bad):
    with pytest.raises(InvalidArgumentError):
        engine.generate("Hello", **bad)
    assert engine.generate("Hello", max_tokens=2, ignore_eos=True).tokens


@pytest.mark.parametrize("bad, field", [(dict(draft_max=0), "draft_max"), (dict(draft_max=4, draft_min=5), "draft_min"),
                                        (dict(draft_max_ngram=99), "draft_max_ngram"), (dict(top_logprobs=999), "top_logprobs"),
                                        (dict(temperature=float("nan")), "temperature"), (dict(min_p=2.0), "min_p"),
                                        (dict(draft_cost=-1.0), "draft_cost"), (dict(repeat_last_n=-2), "repeat_last_n")])
def test_the_engine_is_the_one_authority_on_ranges_and_names_the_field_as_python_does(bad, field):
    """GenerationParams.validate asks cospec_generate_params_check rather than check again; the
    refusal comes back under this side's name of the field (n_draft is draft_max here), which the
    CLI turns into its flag and the server into the request's field."""
    from cospec_local.params import GenerationParams

    with pytest.raises(InvalidArgumentError) as refused:
        GenerationParams(**bad).validate()
    assert refused.value.field == field and str(refused.value).startswith(f"{field}: ")
    native = GenerationParams(**bad).native()
    status, native_field, message = _cospec.generate_params_check(native)
    assert status == InvalidArgumentError.status and message.startswith(f"{native_field}: ")
    assert message.split(": ", 1)[1] == str(refused.value).split(": ", 1)[1]  # the same words on both sides


@pytest.mark.parametrize("bad, field", [(dict(fly_window=0), "fly_window"), (dict(fly_entropy=float("inf")), "fly_entropy"),
                                        (dict(fly_top_k=-1), "fly_top_k"), (dict(aasd_beta=1.5), "aasd_beta")])
def test_the_rules_settings_are_checked_by_the_engine_too(bad, field):
    """FLy's and AASD's settings: cospec_fly/aasd_params_check, which the rules' constructors run,
    answer validate() too, under this side's names."""
    from cospec_local.params import GenerationParams

    with pytest.raises(InvalidArgumentError) as refused:
        GenerationParams(**bad).validate()
    assert refused.value.field == field and str(refused.value).startswith(f"{field}: ")
    rule = field.split("_")[0]
    with pytest.raises(_cospec.CospecError, match=rf"{rule}: \w+: {re.escape(str(refused.value).split(': ', 1)[1])}"):
        params = GenerationParams(**bad)
        (_cospec.Arbiter.fly(params.fly_window, params.fly_entropy, params.fly_top_k) if rule == "fly"
         else _cospec.Arbiter.aasd(params.aasd_alpha, params.aasd_beta))


def test_the_longest_block_is_the_native_limit(engine):
    """A block of COSPEC_N_DRAFT_MAX draft tokens runs; the native check refuses one more, the same
    whether the Python API asks it first (test_invalid_parameters) or generation meets it."""
    keep_all = arbiter_from_function(lambda block: [True] * block["n_draft"], "keep-all")  # the whole budget is one block
    longest = engine.generate("Hello", arbiter=keep_all, max_tokens=_cospec.N_DRAFT_MAX + 1, ignore_eos=True,
                              draft_max=_cospec.N_DRAFT_MAX, adaptive_draft=False)
    assert (longest.stats.blocks, longest.stats.draft_n) == (1, _cospec.N_DRAFT_MAX)
    params = _cospec.GenerateParams()
    params.n_draft = _cospec.N_DRAFT_MAX + 1
    with pytest.raises(_cospec.CospecError, match=rf"n_draft: must be in \[1, {_cospec.N_DRAFT_MAX}\], got {_cospec.N_DRAFT_MAX + 1}"):
        engine._native.generate(engine.tokenize("Hello"), params)


def test_invalid_flash_attention_setting(target_path):
    with pytest.raises(InvalidArgumentError, match="flash_attn"):
        Engine(target_path, flash_attn="fast")
    with pytest.raises(_cospec.CospecError, match="invalid_argument.*flash_attn"):  # the native check
        _cospec.Engine(str(target_path), flash_attn=7)


def test_out_of_vocabulary_prompt_tokens(engine):
    with pytest.raises(InvalidArgumentError, match="outside the vocabulary"):
        engine.generate([1, 2, 10**6])


def test_modes_needing_a_draft(target_path):
    with Engine(target_path) as engine:
        assert engine.generate("Hi", mode="target-only", max_tokens=2, ignore_eos=True).tokens
        with pytest.raises(NoDraftError):
            engine.generate("Hi", mode="speculative", spec_type="draft", max_tokens=2)
        with pytest.raises(NoDraftError):
            engine.generate("Hi", mode="draft-only", max_tokens=2)
        # without a draft model, speculative decoding drafts with the n-gram drafter alone
        plain = engine.generate("a b c a b c a b", mode="target-only", max_tokens=24, ignore_eos=True)
        ngram = engine.generate("a b c a b c a b", mode="speculative", max_tokens=24, ignore_eos=True)
        assert ngram.tokens == plain.tokens and ngram.stats.draft_n == ngram.stats.draft_n_ngram


@pytest.mark.slow
def test_abort_returns_text_so_far(engine):
    result = {}

    def run():
        result["r"] = engine.generate("Tell me a very long story.", mode="speculative", max_tokens=5000, ignore_eos=True)

    worker = threading.Thread(target=run)
    worker.start()
    time.sleep(1.0)
    engine.abort()
    worker.join(30)
    assert not worker.is_alive()
    r = result["r"]
    assert r.stop_reason == "aborted"
    assert 0 < len(r.tokens) < 5000 and r.text
    assert engine.generate("Hello", max_tokens=3, ignore_eos=True).stop_reason == "max_tokens"


def test_arbiter_exception_propagates_and_engine_survives(engine):
    def broken(block):
        raise ZeroDivisionError("arbiter bug")

    with pytest.raises(ZeroDivisionError, match="arbiter bug"):
        engine.generate("The capital of France is", mode="speculative", arbiter=arbiter_from_function(broken), max_tokens=16,
                        adaptive_draft=False)
    assert engine.generate("Hello", max_tokens=3, ignore_eos=True).tokens


def test_arbiter_returning_wrong_shape(engine):
    with pytest.raises(ValueError, match="scores for a block"):
        engine.generate("The capital of France is", mode="speculative",
                        arbiter=arbiter_from_function(lambda block: [True]), max_tokens=16, draft_max=4,
                        adaptive_draft=False)


@pytest.mark.parametrize("label", sorted(__import__("gguf_corpus").EMPTY_NAME_EDITS))
def test_token_texts_that_collide_as_llama_cpp_names_them_are_refused(tmp_path, label):
    """llama.cpp reads token texts as C strings and names an empty one [EMPTY_<id>]; two ids with
    one name abort its loader. Every colliding form is a ModelLoadError before llama.cpp sees it,
    in a process that goes on; the forms that do not collide load and generate."""
    import gguf

    from cospec_local.formats.gguf_edit import open_gguf, rewrite_gguf
    from cospec_local.models import demo_model
    from gguf_corpus import EMPTY_NAME_EDITS

    change = EMPTY_NAME_EDITS[label]
    path = rewrite_gguf(open_gguf(demo_model("target")), tmp_path / f"{label}.gguf",
                        lambda key, v: change(list(v)) if key == gguf.Keys.Tokenizer.LIST else v)
    if label.endswith("-distinct"):
        with Engine(path, n_ctx=128, n_threads=1) as engine:
            assert engine.generate("7 + 5 =", mode="target-only", max_tokens=3).stats.predicted_n > 0
    else:
        with pytest.raises(ModelLoadError, match=r"tokens \d+ and \d+ have the same text"):
            Engine(path, n_ctx=128, n_threads=1)
