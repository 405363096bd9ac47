"""FLy keeps exactly what its reference implementation keeps (github.com/AMD-AGI/FLy,
fly/models/FLy.py): a mismatch at i is kept when the next W-1 draft tokens match the target
exactly, the target's top-3 entropy at i (natural log, temperature 1, full-softmax
probabilities) is at least the threshold, and i lies before the block's last W positions.

The Python reference below follows that code's formulation (sliding windows compared with the
pattern [mismatch, match * (W-1)], the last W positions reset to exact matching, then the entropy
gate), not the engine's loop."""
import math

import numpy as np
import pytest

from cospec_local import Arbiter, arbiter_from_function
from cospec_local import _cospec

N_VOCAB = 16
UNSURE = np.zeros(N_VOCAB, dtype=np.float32)  # uniform: top-3 entropy 3 * (1/16) ln 16 = 0.52 nats
SURE = np.full(N_VOCAB, -30.0, dtype=np.float32)
SURE[0] = 30.0                                 # entropy ~ 0


def block(draft, target, rows):
    logits = np.stack([rows[i] if i < len(rows) else UNSURE for i in range(len(draft) + 1)])
    return {"draft": np.array(draft, dtype=np.int32), "target": np.array(target, dtype=np.int32),
            "target_logits": logits}


def kept(arbiter, b):
    return [bool(p >= arbiter.threshold) for p in arbiter.score(b)]


def top3_entropy(row):
    row = row.astype(np.float64)
    logp = row - (row.max() + np.log(np.exp(row - row.max()).sum()))
    top = np.sort(logp)[-3:]
    return float(-(np.exp(top) * top).sum())


def reference_fly(mismatch, rows, window, threshold):
    """FLy's acceptance as its reference code computes it, for one block."""
    accepted = ~np.asarray(mismatch, dtype=bool)
    k = len(accepted)
    if k < window:
        return [False] * k
    pattern = np.ones(window, dtype=bool)
    pattern[0] = False
    windows = np.lib.stride_tricks.sliding_window_view(accepted, window)
    matched = np.zeros(k, dtype=bool)
    matched[:len(windows)] = (windows == pattern).all(axis=1)
    loose = accepted | matched
    loose[-window:] = accepted[-window:]
    gate = np.array([top3_entropy(rows[i]) >= threshold for i in range(k)])
    return list(loose & ~accepted & gate)


def test_keeps_mismatch_followed_by_agreement_where_target_is_unsure():
    fly = Arbiter.fly(window=3, entropy_threshold=0.3)
    # mismatch at 0, positions 1..2 agree, K = 6: 0 <= K - W - 1
    b = block([5, 1, 2, 3, 4, 6], [9, 1, 2, 3, 4, 6, 7], [UNSURE] * 7)
    assert kept(fly, b) == [True, False, False, False, False, False]


def test_rejects_when_target_is_sure():
    fly = Arbiter.fly(window=3, entropy_threshold=0.3)
    b = block([5, 1, 2, 3, 4, 6], [9, 1, 2, 3, 4, 6, 7], [SURE] + [UNSURE] * 6)
    assert kept(fly, b) == [False] * 6


def test_rejects_when_window_has_a_mismatch():
    fly = Arbiter.fly(window=3, entropy_threshold=0.3)
    # mismatches at 0 and 2: 0's window (1, 2) holds a mismatch, so 0 is rejected;
    # 2's window (3, 4) agrees and 2 = K - W - 1, so 2 is kept.
    b = block([5, 1, 8, 3, 4, 6], [9, 1, 2, 3, 4, 6, 7], [UNSURE] * 7)
    assert kept(fly, b) == [False, False, True, False, False, False]


def test_never_keeps_in_the_last_window():
    fly = Arbiter.fly(window=3, entropy_threshold=0.3)
    # mismatch at 3 = K - W: its window (4, 5) fits and agrees, but the reference resets the
    # last W positions to exact matching, so it is rejected
    b = block([1, 2, 3, 5, 4, 6], [1, 2, 3, 9, 4, 6, 7], [UNSURE] * 7)
    assert kept(fly, b) == [False] * 6
    # the same mismatch one position earlier is kept
    b = block([1, 2, 5, 3, 4, 6], [1, 2, 9, 3, 4, 6, 7], [UNSURE] * 7)
    assert kept(fly, b) == [False, False, True, False, False, False]


def test_entropy_is_over_the_top_three_in_nats_and_inclusive():
    # two equally likely tokens: top-3 entropy ln 2 (the third is ~0)
    two = np.full(N_VOCAB, -1e4, dtype=np.float32)
    two[:2] = 0.0
    assert top3_entropy(two) == pytest.approx(math.log(2), rel=1e-5)
    b = block([5, 1, 2, 3], [9, 1, 2, 3, 4], [two] + [UNSURE] * 4)
    assert kept(Arbiter.fly(window=2, entropy_threshold=0.69), b)[0] is True
    assert kept(Arbiter.fly(window=2, entropy_threshold=0.70), b)[0] is False
    # uniform over 16: full entropy ln 16 = 2.77, top-3 only 0.52
    b = block([5, 1, 2, 3], [9, 1, 2, 3, 4], [UNSURE] * 5)
    assert kept(Arbiter.fly(window=2, entropy_threshold=0.6), b)[0] is False
    assert kept(Arbiter.fly(window=2, entropy_threshold=0.6, entropy_top_k=0), b)[0] is True


def test_defaults_loosen_most_of_a_default_block():
    """The defaults must let FLy act: with K = 8 a mismatch at positions 0..K-W-1 can be kept."""
    w = _cospec.FLY_DEFAULTS["window"]
    k = _cospec.GenerateParams().n_draft
    eligible = k - w
    assert eligible >= k // 2, "FLy's defaults would leave most of a block exact-match only"
    fly = Arbiter.fly()
    for i in range(k):
        draft = list(range(1, k + 1))
        target = draft + [99]
        target[i] = 50
        assert kept(fly, block(draft, target, [UNSURE] * (k + 1)))[i] is (i < eligible)


def test_random_blocks_match_the_reference():
    rng = np.random.default_rng(0)
    fly = Arbiter.fly(window=3, entropy_threshold=0.4)
    n_kept = 0
    for _ in range(300):
        k = int(rng.integers(1, 12))
        draft = rng.integers(0, 4, size=k).astype(np.int32)
        target = np.append(np.where(rng.random(k) < 0.25, (draft + 1) % 4, draft), 0).astype(np.int32)
        rows = [rng.normal(0, rng.choice([0.1, 3.0]), N_VOCAB).astype(np.float32) for _ in range(k + 1)]
        b = block(list(draft), list(target), rows)
        expected = reference_fly(draft != target[:k], rows, 3, 0.4)
        assert kept(fly, b) == expected
        n_kept += sum(expected)
    assert n_kept > 20


def test_invalid_parameters_are_refused():
    with pytest.raises(_cospec.CospecError):
        Arbiter.fly(window=0, entropy_threshold=0.3)
    with pytest.raises(_cospec.CospecError):
        Arbiter.fly(window=3, entropy_threshold=-1.0)
    with pytest.raises(_cospec.CospecError):
        Arbiter.fly(window=3, entropy_threshold=float("nan"))


def python_fly(window, threshold):
    def decide(b):
        return reference_fly(b["mismatch"], b["target_logits"], window, threshold)
    return decide


@pytest.mark.parametrize("k", [4, 8])
@pytest.mark.slow
def test_native_fly_matches_reference_in_the_engine(engine_for, k):
    engine = engine_for("mixed")
    window, threshold = 2, 0.3
    prompts = ["Explain how photosynthesis works in simple terms.", "Write a short story about a robot."]
    n_kept = 0
    for prompt in prompts:
        native = engine.generate(prompt, arbiter="fly", fly_window=window, fly_entropy=threshold, max_tokens=40,
                                 draft_max=k, ignore_eos=True, adaptive_draft=False)
        ref = engine.generate(prompt, arbiter=arbiter_from_function(python_fly(window, threshold)),
                              max_tokens=40, draft_max=k, ignore_eos=True, adaptive_draft=False)
        assert native.tokens == ref.tokens
        assert native.provenance == ref.provenance
        assert native.stats.arbiter_keeps == ref.stats.arbiter_keeps
        n_kept += native.stats.arbiter_keeps
    assert n_kept > 0, "the mixed draft should give FLy mismatches worth keeping"
