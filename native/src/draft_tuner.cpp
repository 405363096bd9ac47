#include "draft_tuner.h"

#include <algorithm>
#include <cmath>

namespace cospec {

namespace {
constexpr double DECAY = 0.9;    // per block: the estimates follow the last ~10 blocks
constexpr double SMOOTH = 0.2;   // weight of a new timing sample
constexpr double MIN_GAIN = 1.05; // drafting must promise this speed-up over plain steps

// A time sample far above the estimate is mostly the machine (a preempted
// thread), not the step: it moves the estimate at most to 3x.
double ema(double old, double x) {
    return old <= 0.0 ? x : (1.0 - SMOOTH) * old + SMOOTH * std::min(x, 3.0 * old);
}
} // namespace

void draft_tuner::observe_block(int32_t kd, int32_t accepted, bool ended_early) {
    since_explore += 1;
    clock += 1;
    // A block the draft declined whole verified one token, as a plain step does:
    // going over to plain steps then rebuilds no graph.
    declined_whole = kd <= 0 && ended_early;
    if (kd <= 0 && !ended_early) {
        exploring = false; // an exploring block cut to nothing (budget, context) taught nothing
        return;
    }
    acc_sum = DECAY * acc_sum + accepted;
    rej_sum = DECAY * rej_sum + (ended_early ? 1.0 : 0.0);
}

void draft_tuner::observe_draft(double first_ms, double step_ms, int32_t n_steps) {
    if (fixed_costs) {
        return;
    }
    if (first_ms >= 0.0) {
        t_draft_first = ema(t_draft_first, first_ms);
    }
    if (n_steps > 0) {
        t_draft = ema(t_draft, step_ms);
    }
}

void draft_tuner::use_fixed_costs(double draft_cost, double verify_marginal) {
    fixed_costs = true;
    t_draft = std::max(draft_cost, 1e-3);
    t_draft_first = t_draft;
    for (int32_t n = 1; n <= MAX_BATCH; ++n) {
        t_verify[n] = 1.0 + (n - 1) * verify_marginal;
        verify_fair[n] = true; // the model's costs are the caller's, nothing to time
    }
}

void draft_tuner::set_acceptance_prior(double accepted, double rejected) {
    acc_sum = std::max(accepted, 1e-3);
    rej_sum = std::max(rejected, 1e-3);
}

void draft_tuner::reset_acceptance() {
    acc_sum = rej_sum = 1.0;
    explore_every = EXPLORE_MIN;
    since_explore = 0;
}

void draft_tuner::observe_verify(int32_t n_tokens, double ms, bool fair) {
    if (fixed_costs || n_tokens < 1 || n_tokens > MAX_BATCH) {
        return;
    }
    // An unfair sample (a rebuild included) only fills a gap; the first fair
    // one replaces it. Averaged in, it kept the demo pair's first block (2.1 ms
    // against 1.6) in the estimate for hundreds of steps of plain decoding,
    // whose rare exploring blocks, after plain steps, were never fair.
    if (!fair) {
        if (!fresh(n_tokens)) {
            t_verify[n_tokens] = ms;
            verify_fair[n_tokens] = false;
            sampled_at[n_tokens] = clock;
        }
        return;
    }
    // Samples of a run of blocks of this size are averaged; one after a pause
    // (a probe of a length not in use) replaces the estimate, which was made
    // under another load of the machine: averaged, a probe every 256 steps
    // took 11 probes to undo an estimate 4x too dear.
    const bool in_a_run = verify_fair[n_tokens] && clock - sampled_at[n_tokens] <= AVERAGE_WITHIN;
    t_verify[n_tokens] = in_a_run ? ema(t_verify[n_tokens], ms) : ms;
    verify_fair[n_tokens] = true;
    sampled_at[n_tokens] = clock;
}

bool draft_tuner::fresh(int32_t n) const {
    return t_verify[n] > 0.0 && (fixed_costs || clock - sampled_at[n] <= STALE_AFTER);
}

// Measured cost of verifying n tokens, interpolated between freshly measured
// batch sizes (linear in n, which is how a compute-bound CPU behaves). An
// estimate not refreshed for STALE_AFTER steps counts as unknown: on a shared
// machine the costs drift by 20% and more between minutes, and a length whose
// old, dear estimate was never measured again held the tuner at K = 2 for
// whole runs (8% slower than K = 8; bench/RESULTS.md).
double draft_tuner::verify_cost(int32_t n) const {
    bool any_fresh = false;
    for (int32_t m = 1; m <= MAX_BATCH && !any_fresh; ++m) {
        any_fresh = fresh(m);
    }
    // (Nothing fresh, which the length in use being measured as it runs should rule out: the old ones.)
    const auto known = [&](int32_t m) { return any_fresh ? fresh(m) : t_verify[m] > 0.0; };
    if (known(n)) {
        return t_verify[n];
    }
    int32_t lo = n - 1, hi = n + 1;
    while (lo >= 1 && !known(lo)) --lo;
    while (hi <= MAX_BATCH && !known(hi)) ++hi;
    const bool has_lo = lo >= 1, has_hi = hi <= MAX_BATCH;
    if (has_lo && has_hi) {
        return t_verify[lo] + (t_verify[hi] - t_verify[lo]) * (n - lo) / (hi - lo);
    }
    if (!has_lo && !has_hi) {
        return 0.0; // nothing measured yet: choose() measures before it asks
    }
    const int32_t side = has_lo ? lo : hi;
    // One side only: assume each extra token costs a third of a single step.
    const double per_token = (known(1) ? t_verify[1] : t_verify[side] / (1.0 + (side - 1) / 3.0)) / 3.0;
    return t_verify[side] + per_token * (n - side);
}

int32_t draft_tuner::choose(int32_t k_max) {
    k_max = std::clamp(k_max, 0, MAX_BATCH - 1);
    if (k_max == 0) {
        return 0;
    }
    // Measure the three quantities first, fairly: plain steps until one follows
    // another, then full blocks until one follows another.
    if (!verify_fair[1] || t_verify[1] <= 0.0) {
        return last_k = settled_k = 0;
    }
    // (Blocks cut short, by --draft-p-min say, are timed at their size; if none
    // reaches a second block of its size, a few tries are enough.)
    const bool block_timed_fairly = std::any_of(verify_fair + 2, verify_fair + MAX_BATCH + 1, [](bool f) { return f; });
    if (t_draft_first <= 0.0 || (!block_timed_fairly && measuring_blocks < MEASURE_MAX_BLOCKS)) {
        measuring_blocks += 1;
        return last_k = settled_k = k_max;
    }
    const double t_step = t_draft > 0.0 ? t_draft : t_draft_first; // K = 1 blocks time no later step
    if (plain_probe_left > 0) {
        plain_probe_left -= 1;
        return last_k = 0;
    }
    if (explore_left > 0) {
        explore_left -= 1;
        return last_k = std::min(last_k, k_max);
    }
    const double a = std::min(acceptance(), 0.99);
    int32_t best = 0, best_drafting = 1; // the best length, and the best above 0
    double best_drafting_rate = 0.0;
    // Measured costs leave out what a block costs beyond its decodes (the
    // draft's catch-up, judging, bookkeeping), so drafting must promise a
    // margin over plain steps; near break-even, noise in the timings would
    // otherwise flip between the two at a loss. A fixed cost model is the
    // caller's and is taken as it is.
    // A change of length pays a graph rebuild: the lengths stick unless another
    // promises more than that (in the units of the costs: a target step).
    const double one_step = verify_cost(1);
    // (Against the length the model last chose: a probe's or an exploration's
    // forced length is no reason to stay.)
    const auto switching = [&](int32_t k) {
        return k == settled_k || (k == 0 && declined_whole) ? 0.0 : SWITCH_COST * one_step;
    };
    // A block verifies at least one token: an estimate below a plain step's is
    // an old sample (costs grow with the context) or noise, and it made a
    // draft that declined every token (--draft-p-min) look worth asking.
    const auto block_verify_cost = [&](int32_t n) { return std::max(verify_cost(n), one_step); };
    double best_rate = (fixed_costs ? 1.0 : MIN_GAIN) / (one_step + switching(0));
    double tokens = 1.0, a_pow = 1.0;
    for (int32_t k = 1; k <= k_max; ++k) {
        a_pow *= a;
        tokens += a_pow; // 1 + a + ... + a^k
        const double rate = tokens / (t_draft_first + (k - 1) * t_step + block_verify_cost(k + 1) + switching(k));
        if (rate > best_rate) {
            best_rate = rate;
            best = k;
        }
        if (rate > best_drafting_rate) {
            best_drafting_rate = rate;
            best_drafting = k;
        }
    }
    if (exploring) { // what the exploring block taught decides when to explore next
        exploring = false;
        explore_every = best == 0 ? std::min(2 * explore_every, EXPLORE_MAX) : EXPLORE_MIN;
    } else if (best > 0) {
        explore_every = EXPLORE_MIN;
    }
    if (probing) { // likewise the probe of plain steps, while drafting
        probing = false;
        probe_every = best > 0 ? std::min(2 * probe_every, EXPLORE_MAX) : EXPLORE_MIN;
    }
    if ((best == 0) != (settled_k == 0)) {
        since_explore = 0; // a switch between drafting and plain steps restarts the count
    }
    settled_k = best;
    // Keep the estimates alive: the acceptance rate is only seen while
    // drafting, the cost of a plain step only while not drafting.
    // (With fixed costs only the acceptance needs keeping alive.)
    if (since_explore >= (best == 0 ? explore_every : probe_every) && (best == 0 || !fixed_costs)) {
        since_explore = 0;
        exploring = best == 0;
        probing = best > 0;
        // Two of each: the first after a switch pays a graph rebuild (and, for a
        // block, a long catch-up), so only the second times the steps fairly.
        plain_probe_left = best == 0 ? 0 : 1;
        explore_left = best == 0 ? 1 : 0;
        if (best == 0) {
            best = settled_k = best_drafting; // its blocks are the last decodes the next choice follows
        } else {
            // Below the longest length, every other probe times two blocks of
            // it instead: nothing else measures the lengths not in use.
            probe_long = best < k_max && !probe_long;
            if (probe_long) {
                plain_probe_left = 0;
                explore_left = 1;
                best = k_max;
            } else {
                best = 0;
            }
        }
    }
    return last_k = best;
}

} // namespace cospec
