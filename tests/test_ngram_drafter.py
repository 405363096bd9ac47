"""The n-gram drafter (native/src/ngram_drafter.cpp): its proposals on crafted token sequences,
checked by hand, then in the engine: lossless on the grounded prompts, apart in the stats and
provenance, and refused where it cannot serve."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cospec_local import Engine, _cospec_internals
from cospec_local.errors import InvalidArgumentError
from cospec_local.models import resolve_model

REPO = Path(__file__).resolve().parents[1]
GROUNDED = [json.loads(line) for line in (REPO / "bench" / "grounded_prompts.jsonl").read_text().splitlines()]
CLI = [sys.executable, "-m", "cospec_local.cli"]


def drafter(*texts: list[int]) -> _cospec_internals.NgramDrafter:
    d = _cospec_internals.NgramDrafter()
    for text in texts:
        d.begin(text)
    return d


def test_the_continuation_of_the_earlier_match_is_proposed():
    # ... 5 6 | 7 8 9 ... 5 6 -> 7 8 9, and on past the end of that occurrence into what followed it
    d = drafter([1, 2, 5, 6, 7, 8, 9, 3, 4, 5, 6])
    assert d.propose(3) == [7, 8, 9]
    assert d.propose(5) == [7, 8, 9, 3, 4]


def test_nothing_is_proposed_without_an_earlier_match_nor_past_the_text():
    assert drafter([1, 2, 3, 4, 5]).propose(8) == []  # no n-gram occurs twice
    assert drafter([]).propose(8) == []
    # the end "4 5" occurred before, but only as the text's own end: nothing followed it
    assert drafter([9, 4, 5]).propose(8) == []
    # a one-token match is not enough (the first token needs two)
    assert drafter([7, 1, 8, 2, 1]).propose(4) == []


def test_the_longest_match_wins_over_a_more_recent_shorter_one():
    # "3 4" is followed by 10 in the long match (5 3 4) and by 20 most recently (6 3 4)
    d = drafter([5, 3, 4, 10, 11, 6, 3, 4, 20, 21, 5, 3, 4])
    assert d.propose(2) == [10, 11]


def test_a_split_vote_stops_the_proposal():
    # "1 2" was followed by 3 once and by 4 once, with equal matches: no majority, no proposal
    assert drafter([1, 2, 3, 9, 1, 2, 4, 8, 1, 2]).propose(4) == []


def test_a_refused_continuation_is_not_proposed_again_and_an_accepted_one_gains():
    d = drafter([1, 2, 3, 9, 5, 1, 2, 3])
    assert d.propose(1) == [9]  # a three-token match
    d.feedback(1, 0)  # the target refused it
    assert d.propose(1) == []
    e = drafter([1, 2, 3, 9, 5, 1, 2, 4, 7, 1, 2, 3, 9, 6, 1, 2])
    assert e.propose(1) == [3]  # "1 2" -> 3 twice, -> 4 once
    e.feedback(1, 0)
    assert e.propose(1) == [4]  # refused: 3's votes weigh a third, and the other continuation leads


def test_each_proposed_token_carries_the_acceptance_learned_at_its_match_length():
    bucket = _cospec_internals.NgramDrafter.support_bucket
    assert [bucket(m) for m in (2, 3, 4, 5, 6, 7, 9, 10, 13, 14, 19, 20, 31, 32)] == \
        [0, 1, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8]
    # 5 6 7 -> 8 9: "8" continues a 3-token match, "9" a 4-token one (the match grows along a copy)
    d = drafter([5, 6, 7, 8, 9, 1, 5, 6, 7])
    assert d.propose(2) == [8, 9]
    assert d.acceptance == pytest.approx([3 / 5, 4 / 6])  # the priors m / (m + 2), before any verdict
    d.feedback(1, 0)  # the first token refused: the 3-token bucket falls, the 4-token one saw nothing
    assert d.bucket_acceptance(bucket(3)) == pytest.approx((2 * 0.6) / 3)
    assert d.bucket_acceptance(bucket(4)) == pytest.approx(4 / 6)
    # tokens the tuner held back were not verified: they teach nothing
    e = drafter([5, 6, 7, 8, 9, 1, 5, 6, 7])
    e.propose(2)
    e.feedback(1, 1)
    assert e.bucket_acceptance(bucket(3)) == pytest.approx((1 + 2 * 0.6) / 3)
    assert e.bucket_acceptance(bucket(4)) == pytest.approx(4 / 6)
    # what was learned survives a reset, which forgets the texts only
    e.clear()
    assert e.bucket_acceptance(bucket(3)) == pytest.approx((1 + 2 * 0.6) / 3)


def proposal_tuner(plain_ms: float = 10.0, extra_token_ms: float = 4.0) -> _cospec_internals.DraftTuner:
    """A tuner that has timed plain steps and blocks of 2 and 9 tokens (costs linear in the tokens)."""
    t = _cospec_internals.DraftTuner()
    for n in (1, 1, 2, 2, 9, 9):
        t.observe_verify(n, plain_ms + (n - 1) * extra_token_ms, True)
    return t


def test_the_tuner_verifies_as_much_of_a_proposal_as_pays_and_holds_the_rest():
    t = proposal_tuner()
    # verifying 1 token costs 1.4 steps: a chance of 0.3 (1.3 tokens) does not pay, with its margin
    assert t.choose_for_proposal([0.3, 0.3, 0.3], k_in_use=0) == 0
    # a copied span's chances: the whole proposal (8 tokens for 3.8 steps)
    assert t.choose_for_proposal([0.98] * 8, k_in_use=0) == 8
    # a sure start and then a coin flip: the sure tokens, a little past them at most
    assert t.choose_for_proposal([0.98, 0.98, 0.98, 0.98, 0.2, 0.2, 0.2, 0.2], k_in_use=0) in (4, 5)


def test_a_proposal_is_held_where_the_draft_model_promises_more():
    """The n-gram drafter is asked first, but drafts only where its proposal beats what the draft
    model's block would give this step (its tuner's expected rate), not merely a plain step."""
    draft = proposal_tuner()
    draft.observe_draft(1.0, 1.0, 7)  # a draft step at a tenth of a target step
    for _ in range(20):
        draft.observe_block(8, 8, False)  # and it agrees almost always
    rate = draft.expected_rate(8)
    assert rate > 1.5 / 10.0  # several tokens per target step's time
    t = proposal_tuner()
    middling = [0.8] * 6
    assert t.choose_for_proposal(middling, k_in_use=0) > 0  # beats plain steps
    assert t.choose_for_proposal(middling, k_in_use=0, rate_to_beat=rate) == 0  # not the draft model
    assert t.choose_for_proposal([0.99] * 30, k_in_use=0, rate_to_beat=rate) > 20  # a copied span still does
    # a draft that does not pay promises nothing to beat
    weak = proposal_tuner()
    weak.observe_draft(12.0, 12.0, 3)
    assert weak.expected_rate(8) == 0.0


def test_held_proposals_are_explored_at_a_doubling_interval():
    t = proposal_tuner()
    low = [0.3, 0.3]

    def held_until_verified() -> int:
        for held in range(1, 1000):
            if t.choose_for_proposal(low, k_in_use=0) > 0:
                return held
            t.observe_held()
        raise AssertionError("never explored")

    assert held_until_verified() == _cospec_internals.DraftTuner.HELD_EXPLORE_MIN
    t.observe_block(1, 0, True)  # the exploration was refused: explore half as often
    assert held_until_verified() == 2 * _cospec_internals.DraftTuner.HELD_EXPLORE_MIN
    t.observe_block(1, 1, False)  # accepted: back to the shortest interval
    assert held_until_verified() == _cospec_internals.DraftTuner.HELD_EXPLORE_MIN


def test_the_pool_lives_across_generations_and_a_chat_continues_its_text():
    d = drafter([10, 11, 12, 13, 14, 15])
    d.begin([1, 2, 10, 11])  # another text: the first one stays searchable
    assert d.propose(3) == [12, 13, 14]
    before = d.pool_size
    d.begin([1, 2, 10, 11, 12, 50])  # the next turn extends the current text: only the new tokens join
    assert d.pool_size == before + 2
    d.clear()
    assert d.pool_size == 0 and d.propose(3) == []


@pytest.fixture(scope="module")
def smollm2():
    with Engine(resolve_model("smollm2-135m"), None, n_ctx=2048, n_threads=2) as engine:
        yield engine


def test_ngram_tokens_are_apart_in_provenance_and_stats(smollm2):
    prompt = "Repeat exactly: the red fox, the blue fox, the red fox, the blue fox, the red fox"
    plain = smollm2.generate(prompt, mode="target-only", max_tokens=32, ignore_eos=True)
    smollm2.reset()
    result = smollm2.generate(prompt, spec_type="ngram", max_tokens=32, ignore_eos=True)
    s = result.stats
    assert result.tokens == plain.tokens
    assert s.blocks_ngram > 0 and s.blocks == s.blocks_ngram and s.draft_n == s.draft_n_ngram
    assert result.provenance.count("ngram") == s.draft_n_matched_ngram == s.draft_n_matched > 0
    assert "match" not in result.provenance and not result.used_draft_model
    assert result.to_json()["stats"]["draft_n_ngram"] == s.draft_n_ngram


@pytest.mark.slow
def test_lossless_on_every_grounded_prompt(smollm2):
    """Greedy n-gram drafting gives target-only's tokens on each grounded prompt, or leaves them
    only where batched verification rounds a near-tie of the target the other way: the two tokens
    are the target's two likeliest there, within half a logit (docs/lossless-output.md)."""
    drafted = 0
    for row in GROUNDED:
        smollm2.reset()
        plain = smollm2.generate(row["prompt"], mode="target-only", max_tokens=48, ignore_eos=True)
        smollm2.reset()
        ngram = smollm2.generate(row["prompt"], spec_type="ngram", max_tokens=48, ignore_eos=True)
        drafted += ngram.stats.draft_n_ngram
        at = next((i for i, (x, y) in enumerate(zip(ngram.tokens, plain.tokens)) if x != y), None)
        if at is None:
            continue
        scores = smollm2.score(smollm2.tokenize(row["prompt"]) + plain.tokens[:at])[-1]
        top2 = set(np.argsort(scores)[-2:].tolist())
        assert {plain.tokens[at], ngram.tokens[at]} == top2, row["kind"]
        assert abs(scores[plain.tokens[at]] - scores[ngram.tokens[at]]) < 0.5, row["kind"]
    assert drafted > 24 * 16  # the set is grounded: the drafter proposes on every prompt


@pytest.mark.slow
def test_sampled_ngram_drafting_keeps_the_targets_distribution(smollm2):
    """At temperature > 0 an n-gram proposal is accepted with the target's probability of it and a
    refusal samples the rest: the first two tokens are distributed as target-only's."""
    from collections import Counter

    from scipy.stats import chi2_contingency

    prompt = "red fox, blue fox, red fox, blue fox, red"  # the drafter proposes " fox, blue" here
    counts = {"target-only": Counter(), "speculative": Counter()}
    proposed = 0
    for mode, seeds in (("target-only", range(400)), ("speculative", range(10_000, 10_400))):
        for seed in seeds:
            r = smollm2.generate(prompt, mode=mode, spec_type="ngram", max_tokens=2, temperature=1.5, seed=seed,
                                 ignore_eos=True, adaptive_draft=False)
            counts[mode][tuple(r.tokens)] += 1
            proposed += r.stats.draft_n_ngram > 0
    assert proposed > 350  # nearly every speculative run verified a proposal
    a, b = counts["target-only"], counts["speculative"]
    assert len(a) >= 5, "the prompt should spread probability over several continuations"
    common = [k for k in set(a) | set(b) if a[k] + b[k] >= 10]
    rows = [[c[k] for k in common] + [sum(c.values()) - sum(c[k] for k in common)] for c in (a, b)]
    assert chi2_contingency(rows)[1] > 1e-3


def run_cli(*args):
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=300, cwd=REPO)


def test_spec_type_refusals_are_one_clear_line():
    out = run_cli("generate", "-p", "Hi", "-n", 2, "--spec-type", "draft-dspark")
    assert out.returncode != 0 and "is one of llama.cpp's kinds that this engine does not have" in out.stderr
    out = run_cli("generate", "-p", "Hi", "-n", 2, "--spec-type", "draft-dflash")
    assert out.returncode != 0 and "asks for the dflash head drafter, but this engine has none" in out.stderr
    assert "Traceback" not in out.stderr
    out = run_cli("generate", "-p", "Hi", "-n", 2, "--spec-type", "bogus")
    assert out.returncode != 0 and "--spec-type" in out.stderr and "unknown 'bogus'" in out.stderr
    out = run_cli("generate", "-m", "smollm2-135m", "-p", "Hi", "-n", 2, "--spec-type", "draft")
    assert out.returncode != 0 and "--spec-type draft needs a draft model: give one with -md DRAFT" in out.stderr
    out = run_cli("generate", "-p", "Hi", "-n", 2, "--spec-type", "ngram", "--arbiter", "demo-lora")
    # --spec-type ngram loads no draft model, on which the learned arbiter runs: the engine refuses it
    assert out.returncode != 0 and "a learned arbiter runs on the draft model, but the engine was opened without one" in out.stderr
    assert "Traceback" not in out.stderr


def test_the_draft_line_says_which_sources_draft():
    out = run_cli("generate", "-m", "smollm2-135m", "-p", "Hi", "-n", 2)
    assert out.returncode == 0 and "draft:  - (the n-gram drafter drafts; -md DRAFT adds a draft model)" in out.stderr
    out = run_cli("generate", "-p", "1 + 2 =", "-n", 2)  # the demo pair, its learned arbiter: the model alone
    assert out.returncode == 0 and "n-gram" not in out.stderr
    out = run_cli("generate", "-p", "1 + 2 =", "-n", 2, "--arbiter", "target")
    assert out.returncode == 0 and "demo" in out.stderr and "and the n-gram drafter" in out.stderr


def test_a_learned_arbiter_without_the_draft_model_is_refused_by_the_engine():
    with Engine.open_default(n_ctx=512, n_threads=1) as engine:
        with pytest.raises(InvalidArgumentError, match="arbiter: '.*' decides the draft model's mismatches, but the draft sources leave the draft model out"):
            engine.generate("1 + 2 =", arbiter="demo-features", spec_type="ngram", max_tokens=2)
