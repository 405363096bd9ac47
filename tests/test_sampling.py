"""Speculative sampling at temperature > 0 is lossless: the tokens it emits are
distributed as the target's own samples, whatever the draft proposes.

The distribution tests draw thousands of short samples: on the demo pair (3.4M parameters, a
sample in 2-3 ms), since what they check is the loop's arithmetic, not a model's size."""
from collections import Counter

import pytest
from scipy.stats import chi2_contingency

from cospec_local import Engine

PROMPT = "My favourite animal is the"
TEMPERATURE = 1.5
N_RUNS = 1000


# chat's samplers, with a penalty strong enough to move the distribution; the prompt repeats
# "the" so the penalty touches likely tokens.
CHAT_SETTINGS = dict(top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.5, repeat_last_n=64)
CHAT_PROMPT = "The cat and the dog and the"


def first_two(engine, mode, seeds, prompt=PROMPT, **kw):
    """Counts of the first token and of the first two, drawn in one block of two draft tokens
    (so the second position's penalty history holds a drafted token)."""
    firsts, seconds = Counter(), Counter()
    for seed in seeds:
        r = engine.generate(prompt, mode=mode, max_tokens=3, draft_max=2, temperature=TEMPERATURE, seed=seed,
                            ignore_eos=True, adaptive_draft=False, **kw)
        firsts[r.tokens[0]] += 1
        seconds[tuple(r.tokens[:2])] += 1
    return firsts, seconds


def p_value(a: Counter, b: Counter) -> float:
    """Chi-square test that two samples come from one distribution; rare
    outcomes are pooled so every cell has a useful expected count."""
    keys = sorted(set(a) | set(b), key=lambda k: -(a[k] + b[k]))
    common = [k for k in keys if a[k] + b[k] >= 10]
    rows = [[a[k] for k in common] + [sum(a.values()) - sum(a[k] for k in common)],
            [b[k] for k in common] + [sum(b.values()) - sum(b[k] for k in common)]]
    if rows[0][-1] + rows[1][-1] == 0:
        rows = [r[:-1] for r in rows]
    return chi2_contingency(rows)[1]


@pytest.fixture(scope="module")
def demo():
    with Engine("demo-target", "demo-draft", n_ctx=512, n_threads=2) as engine:
        yield engine


@pytest.fixture(scope="module")
def samples(demo):
    target = first_two(demo, "target-only", range(N_RUNS))
    sps = first_two(demo, "speculative", range(10_000, 10_000 + N_RUNS))
    return target, sps


@pytest.mark.slow
def test_sps_first_token_distribution_matches_target(samples):
    (t_first, _), (s_first, _) = samples
    assert len(t_first) >= 5, "the prompt should spread probability over several tokens"
    assert p_value(t_first, s_first) > 1e-3


@pytest.mark.slow
def test_sps_second_token_distribution_matches_target(samples):
    (_, t_pair), (_, s_pair) = samples
    assert p_value(t_pair, s_pair) > 1e-3


@pytest.mark.slow
def test_the_statistical_test_detects_a_different_distribution(demo, samples):
    """The same test rejects draft-only sampling, so it has the power to catch a biased engine."""
    (t_first, _), _ = samples
    d_first, _ = first_two(demo, "draft-only", range(20_000, 20_000 + N_RUNS))
    assert p_value(t_first, d_first) < 1e-6


@pytest.fixture(scope="module")
def chat_samples(demo):
    target = first_two(demo, "target-only", range(N_RUNS), CHAT_PROMPT, **CHAT_SETTINGS)
    sps = first_two(demo, "speculative", range(30_000, 30_000 + N_RUNS), CHAT_PROMPT, **CHAT_SETTINGS)
    return target, sps


@pytest.mark.slow
def test_sps_with_chat_samplers_matches_target(demo, chat_samples):
    """top-k, top-p, min-p and the repeat penalty keep speculative sampling lossless."""
    (t_first, t_pair), (s_first, s_pair) = chat_samples
    assert len(t_first) >= 3, "the settings should leave several candidate tokens"
    assert p_value(t_first, s_first) > 1e-3
    assert p_value(t_pair, s_pair) > 1e-3
    # Power: without the penalty the target's own distribution is clearly different.
    plain = {**CHAT_SETTINGS, "repeat_penalty": 1.0}
    u_first, _ = first_two(demo, "target-only", range(40_000, 41_000), CHAT_PROMPT, **plain)
    assert p_value(t_first, u_first) < 1e-6


@pytest.mark.slow
def test_min_p_keeps_only_tokens_near_the_top(engine):
    """Every sampled token has at least min_p x the top token's probability, measured on the
    model's own distribution as llama.cpp does (temperature after the cut: at 2.0 a cut on the
    flattened distribution would also let in tokens at 4-20% of the top)."""
    import numpy as np

    prompt_tokens = engine.tokenize(PROMPT)
    logits = engine.score(prompt_tokens)[-1].astype(np.float64)
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    flattened = np.sqrt(probs / probs.max())
    assert ((flattened >= 0.2) & (probs < 0.2 * probs.max())).sum() >= 1, "the prompt should tell the orders apart"
    seen = {engine.generate(prompt_tokens, mode="target-only", max_tokens=1, temperature=2.0, min_p=0.2,
                            seed=seed).tokens[0] for seed in range(200)}
    assert all(probs[t] >= 0.2 * probs.max() * (1 - 1e-4) for t in seen)
    assert len(seen) >= 2 and seen == {t for t in range(len(probs)) if probs[t] >= 0.2 * probs.max()}


def test_repeat_penalty_follows_llama_cpp(engine):
    """Greedy target-only steps with the penalty equal argmax of the model's logits with every
    token of the last repeat_last_n divided (positive) or multiplied (negative) by the penalty once."""
    import numpy as np

    penalty, last_n, n = 1.8, 6, 12
    prompt_tokens = engine.tokenize("List three colours: red, red, red, red,")
    r = engine.generate(prompt_tokens, mode="target-only", max_tokens=n, ignore_eos=True, repeat_penalty=penalty,
                        repeat_last_n=last_n)
    plain = engine.generate(prompt_tokens, mode="target-only", max_tokens=n, ignore_eos=True)
    assert r.tokens != plain.tokens, "the penalty should change this greedy continuation"
    rows = engine.score(prompt_tokens + r.tokens[:-1])[len(prompt_tokens) - 1:]
    history = prompt_tokens + r.tokens
    for i, row in enumerate(rows):
        row = row.copy()
        for t in set(history[len(prompt_tokens) + i - last_n:len(prompt_tokens) + i]):
            row[t] = row[t] / penalty if row[t] > 0 else row[t] * penalty
        assert int(np.argmax(row)) == r.tokens[i], f"step {i}"


@pytest.mark.slow
def test_greedy_sps_with_repeat_penalty_is_lossless(engine_for):
    """The draft and the target see the same penalised history, in and across blocks."""
    kw = dict(max_tokens=40, ignore_eos=True, repeat_penalty=1.3, repeat_last_n=16)
    for kind in ("mixed", "disagreeing"):
        engine = engine_for(kind)
        reference = engine.generate(PROMPT, mode="target-only", **kw).tokens
        for k in (2, 8):
            r = engine.generate(PROMPT, mode="speculative", draft_max=k, adaptive_draft=False, **kw)
            assert r.tokens == reference, (kind, k)


@pytest.mark.slow
def test_sampling_does_not_depend_on_timing(engine):
    """With sampling, block lengths steer the random stream, so adaptive drafting chooses them
    from this call's counts and cost settings, never clocks: a run repeated after other work
    (which trains the engine's timing model) gives the same tokens."""
    kw = dict(mode="speculative", max_tokens=48, temperature=0.9, seed=3, adaptive_draft=True)
    first = engine.generate(PROMPT, **kw).tokens
    for i in range(4):
        engine.generate("Something else entirely, " * (i + 1), mode="speculative", max_tokens=24)
    assert engine.generate(PROMPT, **kw).tokens == first


@pytest.mark.slow
def test_sampling_is_reproducible_per_seed(engine):
    kw = dict(mode="speculative", max_tokens=24, temperature=0.9, draft_max=4, adaptive_draft=False)
    a = engine.generate(PROMPT, seed=7, **kw)
    b = engine.generate(PROMPT, seed=7, **kw)
    c = engine.generate(PROMPT, seed=8, **kw)
    assert a.tokens == b.tokens
    assert a.tokens != c.tokens
