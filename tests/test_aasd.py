"""AASD's conditional verification (arXiv 2505.13204) keeps what its rule says: a mismatch at i
stands when the target's probability of the draft token is at least min(beta - alpha * H, the
target's top probability), H the target's entropy at i (nats, temperature 1, full softmax).
The Python reference below computes that from the logits directly, not as the engine's loop."""
import numpy as np
import pytest

from cospec_local import Arbiter, arbiter_from_function
from cospec_local import _cospec

N_VOCAB = 16


def block(draft, target, rows):
    return {"draft": np.array(draft, dtype=np.int32), "target": np.array(target, dtype=np.int32),
            "target_logits": np.stack(rows)}


def kept(arbiter, b):
    return [bool(p >= arbiter.threshold) for p in arbiter.score(b)]


def reference_aasd(draft, mismatch, rows, alpha, beta):
    out = []
    for i, d in enumerate(draft):
        row = np.asarray(rows[i], dtype=np.float64)
        p = np.exp(row - row.max())
        p /= p.sum()
        entropy = float(-(p * np.log(p)).sum())
        out.append(bool(mismatch[i]) and p[d] >= min(beta - alpha * entropy, p.max()))
    return out


def row_with(probs):
    """Logits whose softmax is `probs` (the rest of the vocabulary shares what is left)."""
    p = np.full(N_VOCAB, (1.0 - sum(probs.values())) / (N_VOCAB - len(probs)))
    for token, value in probs.items():
        p[token] = value
    return np.log(p).astype(np.float32)


def test_a_likely_enough_draft_token_stands_where_the_target_is_sure():
    aasd = Arbiter.aasd(alpha=0.1, beta=0.1)
    sure = row_with({9: 0.80, 5: 0.15})    # entropy ~0.8 nats: threshold ~0.02; 5 is above it
    doubtful = row_with({9: 0.98, 5: 0.001})  # the draft's 5 is far below it
    b = block([5, 5], [9, 9, 0], [sure, doubtful, doubtful])
    assert kept(aasd, b) == [True, False]


def test_matches_are_never_reported_as_keeps_and_beta_zero_keeps_nothing_below_the_top():
    aasd = Arbiter.aasd(alpha=0.0, beta=0.0)  # threshold 0: every mismatch stands
    rows = [row_with({9: 0.5, 5: 0.2})] * 3
    assert kept(aasd, block([5, 9], [9, 9, 0], rows)) == [True, False]
    strict = Arbiter.aasd(alpha=0.0, beta=1.0)  # threshold: the target's top probability
    assert kept(strict, block([5, 9], [9, 9, 0], rows)) == [False, False]


def test_random_blocks_match_the_reference():
    rng = np.random.default_rng(0)
    alpha, beta = 0.05, 0.3
    aasd = Arbiter.aasd(alpha=alpha, beta=beta)
    n_kept = n_refused = 0
    for _ in range(300):
        k = int(rng.integers(1, 10))
        draft = rng.integers(0, 4, size=k).astype(np.int32)
        target = np.append(np.where(rng.random(k) < 0.4, (draft + 1) % 4, draft), 0).astype(np.int32)
        rows = [rng.normal(0, rng.choice([0.3, 3.0]), N_VOCAB).astype(np.float32) for _ in range(k + 1)]
        expected = reference_aasd(draft, draft != target[:k], rows, alpha, beta)
        assert kept(aasd, block(list(draft), list(target), rows)) == expected
        n_kept += sum(expected)
        n_refused += sum(draft != target[:k]) - sum(expected)
    assert n_kept > 20 and n_refused > 20


def test_defaults_and_invalid_parameters():
    assert _cospec.AASD_DEFAULTS["alpha"] == pytest.approx(0.1)
    assert _cospec.AASD_DEFAULTS["beta"] == pytest.approx(0.1)
    assert Arbiter.aasd().name == "aasd"
    for alpha, beta in ((-0.1, 0.1), (0.1, 1.5), (float("nan"), 0.1), (0.1, float("nan"))):
        with pytest.raises(_cospec.CospecError):
            Arbiter.aasd(alpha=alpha, beta=beta)


@pytest.mark.slow
def test_native_aasd_matches_reference_in_the_engine(engine_for):
    engine = engine_for("mixed")
    alpha, beta = 0.1, 0.3

    def decide(b):
        return reference_aasd(b["draft"], b["mismatch"], b["target_logits"], alpha, beta)

    n_kept = 0
    for prompt in ["Explain how photosynthesis works in simple terms.", "Write a short story about a robot."]:
        native = engine.generate(prompt, arbiter="aasd", aasd_alpha=alpha, aasd_beta=beta, max_tokens=40, draft_max=6,
                                 ignore_eos=True, adaptive_draft=False)
        ref = engine.generate(prompt, arbiter=arbiter_from_function(decide), max_tokens=40, draft_max=6,
                              ignore_eos=True, adaptive_draft=False)
        assert native.tokens == ref.tokens
        assert native.provenance == ref.provenance
        n_kept += native.stats.arbiter_keeps
    assert n_kept > 0, "the mixed draft should give AASD mismatches worth keeping"
