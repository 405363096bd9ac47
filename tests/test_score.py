"""Engine.score: teacher-forced logits of every position, for the target and the draft."""
from __future__ import annotations

import numpy as np
import pytest

from cospec_local import ContextFullError, Engine, InvalidArgumentError, NoDraftError


def test_score_rows_predict_the_greedy_continuation(engine):
    prompt = engine.tokenize("The three primary colours are")
    for which, mode in (("target", "target-only"), ("draft", "draft-only")):
        greedy = engine.generate(prompt, mode=mode, max_tokens=16, ignore_eos=True)
        seq = prompt + list(greedy.tokens)
        logits = engine.score(seq, which)
        assert logits.shape == (len(seq), engine.n_vocab) and logits.dtype == np.float32
        # Row i predicts token i + 1: the greedy continuation is the argmax of the rows it follows.
        assert logits[len(prompt) - 1:-1].argmax(-1).tolist() == list(greedy.tokens), which


def test_generation_after_score_is_unchanged(engine):
    """Scoring replaces a model's cache; the next generation must not reuse stale entries."""
    prompt = engine.tokenize("Once upon a time")
    before = engine.generate(prompt, mode="speculative", max_tokens=24, draft_max=4)
    engine.score(engine.tokenize("Something unrelated, long enough to fill a few cache cells."), "target")
    engine.score(prompt[:2], "draft")
    after = engine.generate(prompt, mode="speculative", max_tokens=24, draft_max=4)
    assert after.tokens == before.tokens


def test_score_rejects_bad_input(engine, target_path):
    with pytest.raises(InvalidArgumentError, match="outside the vocabulary"):
        engine.score([1, engine.n_vocab + 5])
    with pytest.raises(InvalidArgumentError):
        engine.score([1, 2], which="both")
    with pytest.raises(ContextFullError):
        engine.score([1] * (engine.n_ctx + 1))
    with Engine(target_path, n_ctx=256) as target_only:
        with pytest.raises(NoDraftError):
            target_only.score([1, 2, 3], "draft")
        assert target_only.score([1, 2, 3]).shape[0] == 3
    assert engine.generate("Hello", max_tokens=4).stats.predicted_n == 4  # the engine still works
