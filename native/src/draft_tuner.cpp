#include "draft_tuner.h"

#include <algorithm>
#include <cmath>

namespace cospec {

namespace {
constexpr double DECAY = 0.9;    // per block: the estimates follow the last ~10 blocks
constexpr double SMOOTH = 0.2;   // weight of a new timing sample
constexpr double MIN_GAIN = 1.05; // drafting must promise this speed-up over plain steps
// A time sample far above the estimate is mostly the machine (a preempted
// thread), not the step: it moves the estimate at most to this multiple.
constexpr double MAX_SAMPLE_OVER_ESTIMATE = 3.0;
// A run without rejections drives the decayed acceptance estimate to 1; the
// model weighs at most this, so the longest blocks still pay for the odd miss.
constexpr double MAX_ACCEPTANCE = 0.99;
// A block of another length than the last step's costs llama.cpp a graph
// rebuild for the target's verify (and for the plain step after it), in
// target steps; measured with the demo pair on a 2-core CPU: 0.2-0.4 (a
// GPU build's graph capture costs more). Without it a tuner that changed K
// every few blocks paid ~0.2 ms a block more than fixed K (bench/RESULTS.md).
constexpr double SWITCH_COST = 0.3;
// Steps after which a measured cost is stale. The probes refresh a plain
// step's and the longest length's at least every 2 * EXPLORE_MAX steps.
constexpr int64_t STALE_AFTER = 4 * probe_schedule::EXPLORE_MAX;
// Steps within which a new sample of a size is averaged with its estimate.
constexpr int64_t AVERAGE_WITHIN = probe_schedule::EXPLORE_MIN;
// Extrapolating a verify cost from one side only: this many extra tokens cost
// one step, within the slopes measured on 2-core CPUs (0.15-0.39 of a step a token).
constexpr double EXTRA_TOKENS_PER_STEP = 3.0;
// Floors of caller-given values: a draft cost of 0 would read as "not timed
// yet", and zero counts leave the acceptance undefined.
constexpr double MIN_FIXED_DRAFT_COST = 1e-3;
constexpr double MIN_PRIOR_COUNT = 1e-3;

double ema(double old, double x) {
    return old <= 0.0 ? x : (1.0 - SMOOTH) * old + SMOOTH * std::min(x, MAX_SAMPLE_OVER_ESTIMATE * old);
}
} // namespace

// ---------------------------------------------------------------- rate model

length_choice fastest_length(const rate_inputs & in, int32_t k_max) {
    const double one_step = in.verify[1];
    const auto switching = [&](int32_t k) {
        return k == in.k_in_use || (k == 0 && in.plain_in_use) ? 0.0 : in.switch_cost;
    };
    // A block verifies at least one token: an estimate below a plain step's is
    // an old sample (costs grow with the context) or noise, and it made a
    // draft that declined every token (--draft-p-min) look worth asking.
    const auto block_verify_cost = [&](int32_t n) { return std::max(in.verify[n], one_step); };
    length_choice choice {0, 1};
    double best_rate = std::max(in.plain_margin / (one_step + switching(0)), in.rate_to_beat);
    double best_drafting_rate = 0.0;
    double tokens = 1.0, a_pow = 1.0;
    for (int32_t k = 1; k <= k_max; ++k) {
        a_pow *= in.acceptance_at != nullptr ? std::min(in.acceptance_at[k - 1], MAX_ACCEPTANCE) : in.acceptance;
        tokens += a_pow; // 1 + a + ... + a^k
        const double rate = tokens / (in.first_draft + (k - 1) * in.draft_step + block_verify_cost(k + 1) + switching(k));
        if (rate > best_rate) {
            best_rate = rate;
            choice.best = k;
        }
        if (rate > best_drafting_rate) {
            best_drafting_rate = rate;
            choice.best_drafting = k;
        }
    }
    choice.best_rate = best_rate;
    return choice;
}

// ---------------------------------------------------------------- cost estimates

void cost_estimates::observe_draft(double first_ms, double step_ms, int32_t n_steps) {
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

void cost_estimates::observe_catch_up(double ms, int32_t n_tokens) {
    if (!fixed_costs && n_tokens > 0 && ms >= 0.0) {
        t_catch_up = ema(t_catch_up, ms / n_tokens);
    }
}

cost_model cost_model::linear(double draft_cost, double verify_marginal) {
    cost_model m;
    m.first_draft = m.draft_step = draft_cost;
    for (int32_t n = 1; n <= MAX_BLOCK_BATCH; ++n) {
        m.verify[n] = 1.0 + (n - 1) * verify_marginal;
    }
    return m;
}

void cost_estimates::use_fixed(const cost_model & steps) {
    fixed_costs = true;
    t_draft = std::max(steps.draft_step, MIN_FIXED_DRAFT_COST);
    t_draft_first = steps.first_draft > 0.0 ? std::max(steps.first_draft, MIN_FIXED_DRAFT_COST) : t_draft;
    t_catch_up = steps.catch_up > 0.0 ? steps.catch_up : -1.0;
    for (int32_t n = 1; n <= MAX_BLOCK_BATCH; ++n) {
        t_verify[n] = steps.verify[n];
        verify_fair[n] = true; // the model's costs are the caller's, nothing to time
    }
}

void cost_estimates::seed(const cost_model & ms) {
    if (fixed_costs) {
        return;
    }
    if (ms.draft_step > 0.0) {
        t_draft = ms.draft_step;
        t_draft_first = ms.first_draft > 0.0 ? ms.first_draft : ms.draft_step;
    }
    if (ms.catch_up > 0.0) {
        t_catch_up = ms.catch_up;
    }
    for (int32_t n = 1; n <= MAX_BLOCK_BATCH; ++n) {
        if (ms.verify[n] > 0.0) {
            t_verify[n] = ms.verify[n];
            verify_fair[n] = true;
            sampled_at[n] = clock;
        }
    }
}

void cost_estimates::observe_verify(int32_t n_tokens, double ms, bool fair) {
    if (fixed_costs || n_tokens < 1 || n_tokens > MAX_BLOCK_BATCH) {
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

bool cost_estimates::some_block_timed() const {
    return std::any_of(verify_fair + 2, verify_fair + MAX_BLOCK_BATCH + 1, [](bool f) { return f; });
}

bool cost_estimates::fresh(int32_t n) const {
    return t_verify[n] > 0.0 && (fixed_costs || clock - sampled_at[n] <= STALE_AFTER);
}

// Measured costs of verifying n tokens, interpolated between freshly measured
// batch sizes (linear in n, which is how a compute-bound CPU behaves). An
// estimate not refreshed for STALE_AFTER steps counts as unknown: on a shared
// machine the costs drift by 20% and more between minutes, and a length whose
// old, dear estimate was never measured again held the tuner at K = 2 for
// whole runs (8% slower than K = 8; bench/RESULTS.md).
void cost_estimates::verify_costs(int32_t n_max, double * verify) const {
    bool any_fresh = false;
    for (int32_t m = 1; m <= MAX_BLOCK_BATCH && !any_fresh; ++m) {
        any_fresh = fresh(m);
    }
    for (int32_t n = 1; n <= n_max; ++n) {
        verify[n] = verify_cost(n, any_fresh);
    }
}

double cost_estimates::verify_cost(int32_t n, bool any_fresh) const {
    // (Nothing fresh, which the length in use being measured as it runs should rule out: the old ones.)
    const auto known = [&](int32_t m) { return any_fresh ? fresh(m) : t_verify[m] > 0.0; };
    if (known(n)) {
        return t_verify[n];
    }
    int32_t lo = n - 1, hi = n + 1;
    while (lo >= 1 && !known(lo)) --lo;
    while (hi <= MAX_BLOCK_BATCH && !known(hi)) ++hi;
    const bool has_lo = lo >= 1, has_hi = hi <= MAX_BLOCK_BATCH;
    if (has_lo && has_hi) {
        return t_verify[lo] + (t_verify[hi] - t_verify[lo]) * (n - lo) / (hi - lo);
    }
    if (!has_lo && !has_hi) {
        return 0.0; // nothing measured yet: the tuner measures before it asks
    }
    const int32_t side = has_lo ? lo : hi;
    const double one_step = known(1) ? t_verify[1] : t_verify[side] / (1.0 + (side - 1) / EXTRA_TOKENS_PER_STEP);
    return t_verify[side] + one_step / EXTRA_TOKENS_PER_STEP * (n - side);
}

// ---------------------------------------------------------------- probe schedule

std::optional<int32_t> probe_schedule::continue_probe(int32_t last_k, int32_t k_max) {
    if (plain_steps_left > 0) {
        plain_steps_left -= 1;
        return 0;
    }
    if (blocks_left > 0) {
        blocks_left -= 1;
        return std::min(last_k, k_max);
    }
    return std::nullopt;
}

void probe_schedule::learn(int32_t best, int32_t k_in_use) {
    if (exploring) {
        exploring = false;
        explore_every = best == 0 ? std::min(2 * explore_every, EXPLORE_MAX) : EXPLORE_MIN;
    } else if (best > 0) {
        explore_every = EXPLORE_MIN;
    }
    if (probing) {
        probing = false;
        probe_every = best > 0 ? std::min(2 * probe_every, EXPLORE_MAX) : EXPLORE_MIN;
    }
    if ((best == 0) != (k_in_use == 0)) {
        since_probe = 0;
    }
}

int32_t probe_schedule::next(const length_choice & fastest, int32_t k_max, bool fixed_costs, bool worth_exploring) {
    const bool drafting = fastest.best > 0;
    if (since_probe < (drafting ? probe_every : explore_every) || (drafting && fixed_costs) ||
        (!drafting && !worth_exploring)) {
        return fastest.best;
    }
    since_probe = 0;
    // Two steps of each: the first after a switch pays a graph rebuild (and,
    // for a block, a long catch-up), so only the second times the steps fairly.
    if (!drafting) {
        exploring = true;
        blocks_left = EXPLORATION_BLOCKS - 1;
        return fastest.best_drafting;
    }
    probing = true;
    probe_long = fastest.best < k_max && !probe_long;
    if (probe_long) {
        blocks_left = 1;
        return k_max;
    }
    plain_steps_left = 1;
    return 0;
}

// ---------------------------------------------------------------- the tuner

void draft_tuner::observe_block(int32_t kd, int32_t accepted, bool ended_early) {
    const bool plain_step = kd <= 0 && !ended_early;
    if (held_exploring && !plain_step) {
        // An exploration whose first token was refused confirms holding: explore more rarely.
        held_exploring = false;
        held_explore_every = accepted > 0 ? HELD_EXPLORE_MIN : std::min(2 * held_explore_every, HELD_EXPLORE_MAX);
    }
    schedule.count_step(plain_step);
    costs.tick();
    if (plain_step) {
        return;
    }
    acc_sum = DECAY * acc_sum + accepted;
    rej_sum = DECAY * rej_sum + (ended_early ? 1.0 : 0.0);
}

void draft_tuner::set_acceptance_prior(double accepted, double rejected, bool measured) {
    acc_sum = std::max(accepted, MIN_PRIOR_COUNT);
    rej_sum = std::max(rejected, MIN_PRIOR_COUNT);
    prior_measured = measured;
}

void draft_tuner::reset_acceptance() {
    acc_sum = rej_sum = 1.0;
    prior_measured = false;
    schedule.restart();
}

int32_t draft_tuner::choose(int32_t k_max, int32_t n_unread) {
    k_max = std::clamp(k_max, 0, COSPEC_N_DRAFT_MAX);
    if (k_max == 0) {
        return 0;
    }
    if (!costs.fixed() && draft_slower_than_target()) {
        return last_k = settled_k = 0;
    }
    if (const std::optional<int32_t> k = length_to_measure(k_max)) {
        return last_k = settled_k = *k;
    }
    if (const std::optional<int32_t> k = schedule.continue_probe(last_k, k_max)) {
        return last_k = *k;
    }
    const length_choice fastest = fastest_length_now(k_max, n_unread);
    schedule.learn(fastest.best, settled_k);
    settled_k = fastest.best;
    // The first exploration after a switch to plain steps (or a restart) is taken as scheduled:
    // the budget holds back the ones after it, once one has confirmed plain steps.
    const bool explore = (!schedule.plain_confirmed() && !prior_measured) || worth_exploring(fastest.best_drafting, n_unread);
    last_k = schedule.next(fastest, k_max, costs.fixed(), fastest.best == 0 && explore);
    if (fastest.best == 0 && last_k > 0) {
        settled_k = last_k; // an exploration
    }
    return last_k;
}

double draft_tuner::expected_rate(int32_t k_max, int32_t n_unread) const {
    k_max = std::clamp(k_max, 0, COSPEC_N_DRAFT_MAX);
    if (k_max == 0 || !costs.plain_step_timed() || !costs.first_draft_timed() ||
        (!costs.fixed() && draft_slower_than_target())) {
        return 0.0; // not measured yet, or no length pays: nothing to beat
    }
    const length_choice fastest = fastest_length_now(k_max, n_unread);
    return fastest.best > 0 ? fastest.best_rate : 0.0;
}

int32_t draft_tuner::choose_for_proposal(const double * acceptance, int32_t n, int32_t k_in_use, double rate_to_beat) {
    n = std::clamp(n, 0, COSPEC_N_DRAFT_MAX);
    // A plain step's cost first: the blocks' costs are extrapolated from it until measured.
    if (n == 0 || !costs.plain_step_timed()) {
        return 0;
    }
    double verify[MAX_BLOCK_BATCH + 1];
    costs.verify_costs(n + 1, verify);
    rate_inputs in;
    in.acceptance = 0.0;
    in.acceptance_at = acceptance;
    in.first_draft = 0.0; // the proposal is drafted already
    in.draft_step = 0.0;
    in.verify = verify;
    in.switch_cost = SWITCH_COST * verify[1];
    in.k_in_use = k_in_use;
    in.plain_in_use = k_in_use == 0;
    in.plain_margin = costs.fixed() ? 1.0 : MIN_GAIN;
    in.rate_to_beat = rate_to_beat;
    const length_choice fastest = fastest_length(in, n);
    if (fastest.best > 0) {
        return fastest.best;
    }
    if (held + 1 >= held_explore_every) {
        held = 0;
        held_exploring = true;
        return fastest.best_drafting;
    }
    return 0;
}

void draft_tuner::observe_held() { held += 1; }

// Measure the three costs first, fairly: plain steps until one follows
// another, then full blocks until one follows another.
std::optional<int32_t> draft_tuner::length_to_measure(int32_t k_max) {
    if (!costs.plain_step_timed()) {
        return 0;
    }
    if (!costs.first_draft_timed() || (!costs.some_block_timed() && measuring_blocks < MEASURE_MAX_BLOCKS)) {
        measuring_blocks += 1;
        return k_max;
    }
    return std::nullopt;
}

// K draft steps yield at most K + 1 tokens, which K + 1 plain steps give as fast where a draft
// step costs a plain step or more: such a draft (Gemma 3 270M drafting for SmolLM2-135M) pays at
// no length or acceptance, and is neither timed further nor explored (while the target's steps
// stay as cheap). Its measuring blocks cost the first reply 40%: one block, which times its step, is enough.
bool draft_tuner::draft_slower_than_target() const {
    double plain[2];
    costs.verify_costs(1, plain);
    return costs.draft_step_timed() && costs.draft_step() >= plain[1];
}

// An exploration first catches the draft up on what the plain steps since it last read wrote
// (a draft through text re-read a reply at ~5 ms a token against Gemma 3 270M's 20 ms steps: one
// exploration cost 15% of a 96-token reply), then drafts blocks that lose to plain steps at the
// estimates. Both must fit EXPLORE_BUDGET of the time the plain steps since the last one took: a
// draft whose catch-up costs more a token than the budget (a draft as large as its target, one
// drafting through text) is explored only where it has little to read, as a reply begins. The
// blocks' loss counts where their length's verify was measured: an interpolated one is what the
// exploration is there to measure (long blocks timed dear held shorter, cheap ones unexplored).
bool draft_tuner::worth_exploring(int32_t k, int32_t n_unread) const {
    double verify[MAX_BLOCK_BATCH + 1];
    costs.verify_costs(k + 1, verify);
    const double a = std::min(acceptance(), MAX_ACCEPTANCE);
    double tokens = 1.0, a_pow = 1.0;
    for (int32_t i = 1; i <= k; ++i) {
        a_pow *= a;
        tokens += a_pow;
    }
    const double block = costs.first_draft() + (k - 1) * costs.draft_step() + std::max(verify[k + 1], verify[1]);
    const double blocks_loss = costs.verify_measured(k + 1) ? std::max(0.0, block - tokens * verify[1]) : 0.0;
    const double loss = costs.catch_up(n_unread) + probe_schedule::EXPLORATION_BLOCKS * blocks_loss;
    return loss <= EXPLORE_BUDGET * (double) schedule.steps_since_probe() * verify[1];
}

length_choice draft_tuner::fastest_length_now(int32_t k_max, int32_t n_unread) const {
    double verify[MAX_BLOCK_BATCH + 1];
    costs.verify_costs(k_max + 1, verify);
    rate_inputs in;
    in.acceptance = std::min(acceptance(), MAX_ACCEPTANCE);
    in.first_draft = costs.first_draft();
    in.draft_step = costs.draft_step();
    in.verify = verify;
    // A change of length pays a graph rebuild: the lengths stick unless another
    // promises more than that (in the units of the costs: a target step).
    in.switch_cost = SWITCH_COST * verify[1];
    if (settled_k == 0) {
        in.switch_cost += costs.catch_up(n_unread); // and blocks after plain steps first catch the draft up
    }
    in.k_in_use = settled_k;
    // Leaving blocks for plain steps rebuilds the graph once, for a run of steps that lasts at
    // least until the next exploration: charged to every plain step, it held drafts that lost
    // 20% to plain steps (a draft through text at K = 1) in use for whole replies.
    in.plain_in_use = true;
    // Measured costs leave out what a block costs beyond its decodes (the
    // draft's catch-up, judging, bookkeeping), so drafting must promise a
    // margin over plain steps; near break-even, noise in the timings would
    // otherwise flip between the two at a loss. A fixed cost model is the
    // caller's and is taken as it is.
    in.plain_margin = costs.fixed() ? 1.0 : MIN_GAIN;
    return fastest_length(in, k_max);
}

} // namespace cospec
