"""The adaptive draft length's model (native/src/draft_tuner.cpp) replayed on chosen timings, so
that what it decides from a history of costs does not depend on this machine's clock; and its rate
model alone, on costs whose best length is worked out by hand."""
from collections import Counter

from cospec_local import _cospec_internals


def replay(tuner, steps, verify_ms, first_ms=0.5, step_ms=0.1, k_max=8, state=None):
    """Drive the tuner as a generation does, with every drafted token accepted; the lengths chosen.
    A decode counts as a fair sample when the one before it had the same size (no graph rebuild)."""
    state = {"last_n": 0} if state is None else state
    chosen = []
    for _ in range(steps):
        k = tuner.choose(k_max)
        chosen.append(k)
        if k > 0:
            tuner.observe_draft(first_ms, step_ms, k - 1)
        tuner.observe_verify(k + 1, verify_ms(k + 1), state["last_n"] == k + 1)
        tuner.observe_block(k, k, False)
        state["last_n"] = k + 1
    return chosen


def linear_by(per_token):
    """Cost of verifying n tokens where each token after the first costs per_token of a step."""
    return lambda n: 1.0 + per_token * (n - 1)


linear = linear_by(0.15)  # ms to verify n tokens on a CPU where each extra token costs 0.15 of a step


def test_a_pair_that_always_agrees_drafts_the_longest_blocks():
    chosen = replay(_cospec_internals.DraftTuner(), 2000, linear)
    assert Counter(chosen[-1000:])[8] >= 950  # the rest: probes of a plain step's cost


def test_plain_steps_win_where_verifying_costs_a_step_a_token():
    chosen = replay(_cospec_internals.DraftTuner(), 2000, lambda n: float(n), first_ms=0.6, step_ms=0.3)
    assert Counter(chosen[-1000:])[0] >= 950  # the rest: exploring blocks


def test_a_length_measured_dear_once_is_measured_again():
    """Long blocks timed 4x too dear for a while (the machine busy), then the load goes: the tuner
    settles on shorter blocks meanwhile, and once the costs are back it must find the long blocks
    again. Before, nothing measured a length not in use: the estimate stayed 4x too dear and the
    tuner stayed at K = 4 for good (on the demo pair, runs at K = 2 were 8% slower than K = 8)."""
    tuner, state = _cospec_internals.DraftTuner(), {"last_n": 0}
    busy = replay(tuner, 300, lambda n: linear(n) * (4.0 if n >= 6 else 1.0), state=state)
    assert Counter(busy).most_common(1)[0][0] in range(1, 6)
    after = replay(tuner, 1500, linear, state=state)
    assert Counter(after[:300])[8] >= 150, Counter(after[:300])  # the first probe of the longest length
    assert Counter(after[-1000:])[8] >= 950


def test_the_rate_model_takes_the_length_of_the_most_tokens_per_unit_time():
    """a = 0.8, draft calls of 0.1, verifying n tokens 1 + 0.1 (n - 1): a block of K costs 1 + 0.2 K
    and yields 1 + a + ... + a^K = 5 (1 - 0.8^(K+1)) tokens: 1.50, 1.74, 1.85, 1.87, 1.84 tokens a unit
    of time for K = 1..5, against 1 for a plain step."""
    assert _cospec_internals.fastest_length(8, 0.8, 0.1, 0.1, linear_by(0.1)) == (4, 4)


def test_a_length_in_use_is_kept_unless_another_pays_for_the_switch():
    """As above with K = 3 in use and a switch costing 0.1: K = 4 would make 3.36 / 1.9 = 1.77 tokens
    a unit of time, K = 3 makes 2.95 / 1.6 = 1.85."""
    assert _cospec_internals.fastest_length(8, 0.8, 0.1, 0.1, linear_by(0.1), switch_cost=0.1, k_in_use=3) == (3, 3)


def test_plain_steps_unless_drafting_beats_them_by_the_margin():
    # Verifying costs a step a token: K = 1 makes 1.5 / (0.3 + 2) = 0.65 tokens a unit of time.
    assert _cospec_internals.fastest_length(8, 0.5, 0.3, 0.3, float) == (0, 1)
    # K = 1 makes 1.5 / (0.1 + 1.3) = 1.07, K = 2 1.75 / 1.8 = 0.97: ahead of a plain step by 7%.
    assert _cospec_internals.fastest_length(8, 0.5, 0.1, 0.1, linear_by(0.3), plain_margin=1.05) == (1, 1)
    assert _cospec_internals.fastest_length(8, 0.5, 0.1, 0.1, linear_by(0.3), plain_margin=1.1) == (0, 1)


def explorations(catch_up_ms_per_token, steps=3000):
    """Blocks taken in the last 1000 of `steps` where plain steps win (verifying costs a step a
    token) and a block after plain steps first catches the draft up on them at this cost a token."""
    tuner, unread, last_n, blocks = _cospec_internals.DraftTuner(), 0, 0, 0
    for step in range(steps):
        k = tuner.choose(8, unread)
        if k > 0:
            if unread > 2:
                tuner.observe_catch_up(catch_up_ms_per_token * unread, unread)
            tuner.observe_draft(0.6, 0.3, k - 1)
            unread = 0
            blocks += step >= steps - 1000
        else:
            unread += 1
        tuner.observe_verify(k + 1, float(k + 1), last_n == k + 1)
        tuner.observe_block(k, k, False)
        last_n = k + 1
    return blocks


def test_an_exploration_whose_catch_up_overruns_the_budget_is_not_taken():
    """A plain step costs 1 here. Catching the draft up at 0.005 a token stays within the 2% budget
    (with the blocks' own loss), and explorations go on; at 0.1 a token (a draft through text
    re-reads a reply at ~0.25 of Gemma 3 270M's step) they would cost 10% of the time, and neither
    an exploration nor the model's own switch to blocks (the catch-up counts there too) is taken."""
    assert _cospec_internals.DraftTuner.EXPLORE_BUDGET == 0.02
    assert explorations(0.005) >= 2 * 2
    assert explorations(0.1) == 0


def test_a_draft_slower_than_its_target_is_not_drafted_after_its_first_block():
    """Each draft step costs 1.2 plain steps: K steps for at most K + 1 tokens never beat K + 1
    plain steps, at any acceptance. One measuring block times the step; no block follows (the
    text path's first measuring blocks of Gemma 3 270M drafting for SmolLM2 cost a reply 40%)."""
    chosen = replay(_cospec_internals.DraftTuner(), 2000, linear, first_ms=1.5, step_ms=1.2)
    assert sum(k > 0 for k in chosen) == 1 and chosen[2] == 8
