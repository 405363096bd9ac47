"""No model file may abort, hang or exhaust the process: the corpus of structured corruptions of
the demo pair (tests/gguf_corpus.py, over 1,000 cases), the shipped arbiters, an EAGLE-3 head and a DFlash drafter
ends, case by case, in a clean typed error with a short, valid message, or in a correct run with
finite logits."""
import pytest

from cospec_local.models import demo_model
from gguf_corpus import arbiter_cases, build, head_cases, run, shipped_arbiters, verdict


def assert_clean(cases, error_classes: set[str]) -> None:
    """Every case ends in a typed error of these classes or a correct run, and both outcomes occur."""
    results = run(cases)
    assert len(results) == len(cases)
    failures = [(r["name"], verdict(r)) for r in results if verdict(r)]
    assert failures == []
    outcomes = {r["outcome"] for r in results}
    assert outcomes == {"error", "run"}
    classes = {r["error_class"] for r in results if r["outcome"] == "error"}
    assert classes <= error_classes, classes


@pytest.mark.slow
def test_every_corrupted_model_is_a_clean_error_or_a_correct_run(tmp_path):
    cases = build(tmp_path, demo_model("target"), demo_model("draft"))
    assert len(cases) >= 1000
    assert_clean(cases, {"ModelLoadError", "VocabMismatchError", "DecodeError", "InvalidArgumentError",
                         "ContextFullError"})  # (a context_length of 1: the prompt does not fit)


@pytest.mark.slow
def test_every_corrupted_arbiter_is_a_clean_error_or_a_correct_run(tmp_path):
    """The shipped arbiters' files (the LoRA adapter, the head and its metadata) corrupted one at a
    time: loading and asking the arbiter ends in a typed error or a run with finite P(keep)."""
    cases = arbiter_cases(tmp_path, demo_model("target"), demo_model("draft"), shipped_arbiters())
    assert len(cases) >= 400
    # (ArbiterDraftError: a corrupted draft fingerprint reads as an arbiter made for another draft)
    assert_clean(cases, {"ArbiterError", "ArbiterDraftError", "AdapterError"})


@pytest.mark.slow
def test_every_corrupted_head_is_a_clean_error_or_a_correct_run(tmp_path):
    """The shipped EAGLE-3 head for SmolLM2 corrupted one thing at a time (its keys, the layers it
    reads and the width it names, tensor infos, header, bit flips), opened beside its target and
    drafted from, greedy and sampled: a typed error, never llama.cpp's abort or a hang."""
    from cospec_local.models import resolve_model

    cases = head_cases(tmp_path, resolve_model("smollm2-135m"), resolve_model("smollm2-135m-eagle3"))
    assert len(cases) >= 200
    assert_clean(cases, {"ModelLoadError", "VocabMismatchError", "InvalidArgumentError"})


@pytest.mark.slow
def test_every_corrupted_dflash_drafter_is_a_clean_error_or_a_correct_run(tmp_path):
    """The same for a DFlash drafter (the zoo's, beside the zoo's llama), its mask token and block
    length corrupted too: llama.cpp takes both on trust."""
    from pathlib import Path

    from cospec_local.formats import tiny_models

    models = tiny_models.build(["llama", "llama-dflash"], tiny_models.cache_dir(Path(__file__).resolve().parents[1]))
    cases = head_cases(tmp_path, models["llama"], models["llama-dflash"])
    # Every case of what is DFlash's own (its keys, layers, width, mask, block, fc and encoder
    # norm), and half of the generic ones, which the EAGLE-3 head's corpus runs in full.
    own = ("dflash", "mask", "block", "fc", "enc")
    cases = [c for i, c in enumerate(cases) if i % 2 == 0 or any(k in c.name for k in own)]
    assert len(cases) >= 120
    assert_clean(cases, {"ModelLoadError", "VocabMismatchError", "InvalidArgumentError"})
