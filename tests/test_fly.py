"""FLy keeps exactly what its rule says: a mismatch at i is kept when the next
W-1 draft tokens match the target, the target's entropy at i reaches the
threshold, and i is not within the block's last W positions."""
import math

import numpy as np
import pytest

from cospec_local import Arbiter, arbiter_from_function
from cospec_local import _cospec

N_VOCAB = 16
UNSURE = np.zeros(N_VOCAB, dtype=np.float32)  # uniform: entropy ln(16) = 2.77 nats
SURE = np.full(N_VOCAB, -30.0, dtype=np.float32)
SURE[0] = 30.0                                 # entropy ~ 0


def block(draft, target, rows):
    logits = np.stack([rows[i] if i < len(rows) else UNSURE for i in range(len(draft) + 1)])
    return np.array(draft, dtype=np.int32), np.array(target, dtype=np.int32), logits


def test_keeps_mismatch_followed_by_agreement_where_target_is_unsure():
    fly = Arbiter.fly(window=3, entropy_threshold=0.3)
    # mismatch at 0, positions 1..2 agree, K = 6 > 0 + W
    d, t, lg = block([5, 1, 2, 3, 4, 6], [9, 1, 2, 3, 4, 6, 7], [UNSURE] * 7)
    assert fly.decide(d, t, lg) == [True, False, False, False, False, False]


def test_rejects_when_target_is_sure():
    fly = Arbiter.fly(window=3, entropy_threshold=0.3)
    d, t, lg = block([5, 1, 2, 3, 4, 6], [9, 1, 2, 3, 4, 6, 7], [SURE] + [UNSURE] * 6)
    assert fly.decide(d, t, lg) == [False] * 6


def test_rejects_when_window_has_a_mismatch():
    fly = Arbiter.fly(window=3, entropy_threshold=0.3)
    # mismatches at 0 and 2: 0's window (1, 2) holds a mismatch, so 0 is rejected;
    # 2's window (3, 4) agrees and 2 < K - W, so 2 is kept.
    d, t, lg = block([5, 1, 8, 3, 4, 6], [9, 1, 2, 3, 4, 6, 7], [UNSURE] * 7)
    assert fly.decide(d, t, lg) == [False, False, True, False, False, False]


def test_never_keeps_in_the_last_window():
    fly = Arbiter.fly(window=3, entropy_threshold=0.3)
    # mismatch at 3 with K=6: 3 >= K - W, so never kept even though what follows agrees
    d, t, lg = block([1, 2, 3, 5, 4, 6], [1, 2, 3, 9, 4, 6, 7], [UNSURE] * 7)
    assert fly.decide(d, t, lg) == [False] * 6
    # the same mismatch one position earlier is kept
    d, t, lg = block([1, 2, 5, 3, 4, 6], [1, 2, 9, 3, 4, 6, 7], [UNSURE] * 7)
    assert fly.decide(d, t, lg) == [False, False, True, False, False, False]


def test_entropy_threshold_is_inclusive_and_in_nats():
    # two equally likely tokens: entropy ln 2
    two = np.full(N_VOCAB, -1e4, dtype=np.float32)
    two[:2] = 0.0
    assert _cospec.entropy(two) == pytest.approx(math.log(2), rel=1e-5)
    d, t, lg = block([5, 1, 2, 3], [9, 1, 2, 3, 4], [two] + [UNSURE] * 4)
    assert Arbiter.fly(window=2, entropy_threshold=0.69).decide(d, t, lg)[0] is True
    assert Arbiter.fly(window=2, entropy_threshold=0.70).decide(d, t, lg)[0] is False


def test_invalid_parameters_are_refused():
    with pytest.raises(_cospec.CospecError):
        Arbiter.fly(window=0, entropy_threshold=0.3)
    with pytest.raises(_cospec.CospecError):
        Arbiter.fly(window=3, entropy_threshold=-1.0)


def python_fly(window, threshold):
    """FLy's rule in Python, as a reference for the native arbiter."""
    def decide(b):
        k = b["n_draft"]
        keep = np.zeros(k, dtype=bool)
        for i in np.flatnonzero(b["mismatch"]):
            if i >= k - window or b["mismatch"][i + 1:i + window].any():
                continue
            row = b["target_logits"][i].astype(np.float64)
            p = np.exp(row - row.max())
            p /= p.sum()
            keep[i] = -(p[p > 0] * np.log(p[p > 0])).sum() >= threshold
        return keep
    return decide


@pytest.mark.parametrize("k", [4, 8])
def test_native_fly_matches_reference_in_the_engine(engine_for, k):
    engine = engine_for("mixed")
    window, threshold = 2, 0.3
    prompts = ["Explain how photosynthesis works in simple terms.", "Write a short story about a robot."]
    kept = 0
    for prompt in prompts:
        native = engine.generate(prompt, mode="fly", fly_window=window, fly_entropy=threshold, max_tokens=40,
                                 draft_max=k, ignore_eos=True, adaptive_draft=False)
        ref = engine.generate(prompt, mode="sps", arbiter=arbiter_from_function(python_fly(window, threshold)),
                              max_tokens=40, draft_max=k, ignore_eos=True, adaptive_draft=False)
        assert native.tokens == ref.tokens
        assert native.provenance == ref.provenance
        assert native.stats.n_kept == ref.stats.n_kept
        kept += native.stats.n_kept
    assert kept > 0, "the mixed draft should give FLy mismatches worth keeping"
