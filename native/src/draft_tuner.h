// Adaptive draft length: choose K for the next block from online estimates of
// the draft's acceptance rate and of the measured costs, maximising expected
// tokens per unit time (Leviathan et al.'s model with a measured verify cost):
//   E[tokens](K) = (1 - a^(K+1)) / (1 - a),
//   time(K) = t_first + (K - 1) * t_draft + t_verify(K + 1) [+ switch cost if K changes].
// t_first, the block's first draft call, also catches the draft up on the
// tokens the last block settled: with tiny models it costs far more than a
// later draft step, and averaging the two made short blocks look cheaper than
// they are (each short block then measured a dearer average: a trap that kept
// the tuner at short blocks and plain steps while fixed K = 5-8 ran 5% faster).
// On a CPU verifying K+1 tokens costs almost K+1 steps, so with a weak draft the
// best K is often 0 (plain target decoding); a strong draft gets long blocks.
//
// Three parts: the rate model (fastest_length, a pure function of the
// estimates), the estimates of the costs (cost_estimates), and the schedule of
// probes that keeps those estimates alive (probe_schedule); draft_tuner joins
// them with the acceptance estimate.
#pragma once

#include "cospec.h"

#include <cstdint>
#include <optional>

namespace cospec {

// The most tokens a block's verify decodes: its draft tokens and the token before them.
constexpr int32_t MAX_BLOCK_BATCH = COSPEC_N_DRAFT_MAX + 1;

// ---------------------------------------------------------------- rate model

// What the rate model weighs, the costs in one unit: milliseconds measured, or
// target steps of a fixed cost model.
struct rate_inputs {
    double acceptance;     // a: the chance that the draft's next token is accepted (below 1)
    double first_draft;    // a block's first draft call, which catches the draft up on the last block's tokens
    double draft_step;     // each later draft step
    const double * verify; // verify[n]: the target decoding n tokens, for n in [1, k_max + 1]
    double switch_cost;    // taking a length other than the one in use: llama.cpp rebuilds the target's graph
    int32_t k_in_use;      // the length in use (0: plain steps), which pays no switch
    bool plain_in_use;     // plain steps pay no switch either: the last decode verified one token, as they do
                           // (the model draft's tuner always says so: draft_tuner::fastest_length_now)
    double plain_margin;   // drafting must promise this factor over plain steps
    // Where the proposal's tokens have chances of their own (the n-gram drafter's): the chance
    // of the k-th token, given the ones before it, is acceptance_at[k - 1]; acceptance is unused.
    const double * acceptance_at = nullptr;
    // A rate (tokens per unit of these costs) another source offers for this step: a length must
    // beat it too, or the choice is 0 (leave the step to that source, or to a plain step).
    double rate_to_beat = 0.0;
};

struct length_choice {
    int32_t best;          // the length of the most tokens per unit time; 0: a plain target step
    int32_t best_drafting; // the best length above 0 (what an exploration of drafting takes)
    double best_rate = 0.0; // tokens per unit time at `best` (a drafting length's; at 0, a plain step's)
};

// The block length in [0, k_max] that maximises expected tokens per unit time.
length_choice fastest_length(const rate_inputs & in, int32_t k_max);

// ---------------------------------------------------------------- cost estimates

// A pair's costs as a whole: in target steps (a fixed cost model), or in milliseconds (a
// calibration's measurements, the seed of the timed estimates).
struct cost_model {
    double first_draft = 0.0; // a block's first draft call (0: no draft model)
    double draft_step = 0.0;  // each later draft step
    double catch_up = 0.0;    // the draft reading one token of a long catch-up (0: unknown)
    double verify[MAX_BLOCK_BATCH + 1] = {}; // verify[n]: decoding n tokens, n in [1, MAX_BLOCK_BATCH]

    // The linear model of a draft step's cost and each verified token's beyond the first.
    static cost_model linear(double draft_cost, double verify_marginal);
};

// What a block's draft calls and verify decodes cost: timed samples averaged
// per batch size, or a fixed cost model. Ages count in steps (tick).
class cost_estimates {
  public:
    // See draft_tuner::observe_draft / observe_verify / use_fixed_costs.
    void observe_draft(double first_ms, double step_ms, int32_t n_steps);
    void observe_verify(int32_t n_tokens, double ms, bool fair);
    void use_fixed(const cost_model & steps);
    // Start the timed estimates from measured costs (ms), each as a fresh, fair sample.
    void seed(const cost_model & ms);
    void tick() { clock += 1; }

    bool fixed() const { return fixed_costs; }
    bool plain_step_timed() const { return verify_fair[1] && t_verify[1] > 0.0; }
    bool some_block_timed() const; // a verify of 2 tokens or more came from fair samples
    bool first_draft_timed() const { return t_draft_first > 0.0; }
    double first_draft() const { return t_draft_first; }
    // Catching the draft up on n tokens it has not read (after plain steps); 0 until measured.
    double catch_up(int32_t n) const { return t_catch_up > 0.0 ? t_catch_up * n : 0.0; }
    void observe_catch_up(double ms, int32_t n_tokens);
    double draft_step() const { return t_draft > 0.0 ? t_draft : t_draft_first; } // K = 1 blocks time no later step
    bool draft_step_timed() const { return t_draft > 0.0; }
    // verify[n] for n in [1, n_max]: measured where fresh, else interpolated.
    void verify_costs(int32_t n_max, double * verify) const;
    bool verify_measured(int32_t n) const { return n >= 1 && n <= MAX_BLOCK_BATCH && fresh(n); }

  private:
    bool fresh(int32_t n) const; // t_verify[n] was measured within STALE_AFTER steps
    double verify_cost(int32_t n, bool any_fresh) const;

    double t_draft = -1.0;       // a draft step after the block's first
    double t_draft_first = -1.0; // the block's first draft call, catch-up included
    double t_catch_up = -1.0;    // a token of a long catch-up (the draft reading what plain steps wrote)
    double t_verify[MAX_BLOCK_BATCH + 1] = {};
    bool verify_fair[MAX_BLOCK_BATCH + 1] = {};   // t_verify[n] comes from fair samples
    int64_t sampled_at[MAX_BLOCK_BATCH + 1] = {}; // `clock` at t_verify[n]'s last sample
    int64_t clock = 0;                            // blocks and plain steps observed
    bool fixed_costs = false;
};

// ---------------------------------------------------------------- probe schedule

// When to take a length the rate model did not choose, to keep its estimates
// alive: the acceptance rate is only seen while drafting, a plain step's cost
// only while not drafting, a length's verify cost only while it is in use.
//
// While drafting does not pay, two blocks in explore_every still draft (of the
// best length above 0), to see whether the draft has started agreeing and what
// blocks cost now. Each such block costs a draft catch-up and a longer verify,
// so the interval doubles after every exploration that confirms plain steps (up
// to EXPLORE_MAX), and goes back to EXPLORE_MIN once drafting pays; and one is
// taken only where its catch-up and its blocks' loss fit draft_tuner::EXPLORE_BUDGET
// of the time the plain steps since the last took (draft_tuner::worth_exploring). While
// drafting, the probe of a plain step's cost is two plain steps (the first after
// a block is not a fair sample, see generate.cpp); its interval doubles the same
// way while each probe confirms drafting: at 2 plain steps and 2 graph rebuilds
// per 16 blocks (the starting interval) the probes cost the demo pair ~2% against
// fixed K. Below the longest length, every other probe times two blocks of the
// longest length instead: nothing else measures the lengths not in use.
class probe_schedule {
  public:
    static constexpr int64_t EXPLORE_MIN = 16;
    static constexpr int64_t EXPLORE_MAX = 128;
    static constexpr int32_t EXPLORATION_BLOCKS = 2; // the first pays a rebuild and the catch-up; the second is timed

    int64_t steps_since_probe() const { return since_probe; }
    // An exploration has confirmed plain steps since drafting last paid (or the estimates restarted).
    bool plain_confirmed() const { return explore_every > EXPLORE_MIN; }
    // A step was taken. A plain one ends an exploration untaught: its block was
    // cut to nothing (the token budget, the context).
    void count_step(bool plain_step) {
        since_probe += 1;
        exploring = exploring && !plain_step;
    }
    // The acceptance estimate starts afresh: explore again soon.
    void restart() {
        explore_every = EXPLORE_MIN;
        since_probe = 0;
    }
    // The second step of a probe under way, if one is (last_k: the length taken last).
    std::optional<int32_t> continue_probe(int32_t last_k, int32_t k_max);
    // The model now chooses `best` where `k_in_use` was in use: what the last
    // probe taught sets the next interval, and a switch between drafting and
    // plain steps restarts the count.
    void learn(int32_t best, int32_t k_in_use);
    // The length to take: the model's, or the first step of a probe that is due.
    // With fixed costs only the acceptance needs keeping alive. `worth_exploring`: an
    // exploration would cost within the budget; else none is taken.
    int32_t next(const length_choice & fastest, int32_t k_max, bool fixed_costs, bool worth_exploring);

  private:
    int64_t since_probe = 0;             // steps since the last probe or exploration, or switch
    int64_t explore_every = EXPLORE_MIN; // steps between explorations while plain steps win
    int64_t probe_every = EXPLORE_MIN;   // blocks between probes while drafting
    bool exploring = false;              // the last blocks taken were an exploration
    bool probing = false;                // the last forced lengths were a probe while drafting
    bool probe_long = false;             // the last probe while drafting timed the longest length
    int32_t plain_steps_left = 0;        // plain steps still to take in a probe of their cost
    int32_t blocks_left = 0;             // blocks of the last length still to take in a probe or exploration
};

// ---------------------------------------------------------------- the tuner

class draft_tuner {
  public:
    // Cost of each verified token beyond the first, relative to one target
    // step, for the fixed cost model: measured v(K) on 2-core CPUs lies
    // between 1 + 0.15 K (Gemma 3 270M) and 1 + 0.39 K (SmolLM2-135M).
    static constexpr double FIXED_VERIFY_MARGINAL = COSPEC_DEFAULT_VERIFY_COST;
    // Acceptance prior (decayed counts, a = 24/25) of a call whose arbiter keeps
    // mismatches: from a = 0.5 each short answer began at K = 1-2, and from
    // 8/9 at K = 5, where the switching cost then held it although the demo
    // pair accepts 99% of the tokens of a block that does not reach its
    // answer's end; 24/25 starts at K = 8. Other calls keep a = 0.5, which
    // costs less on a pair that rarely agrees (bench/RESULTS.md).
    static constexpr double KEEPING_PRIOR_ACCEPTED = 24.0;
    static constexpr double KEEPING_PRIOR_REJECTED = 1.0;

    // Draft length for the next block, in [0, k_max]. n_unread: the tokens written since the
    // draft last read the text, which a block would first catch it up on.
    int32_t choose(int32_t k_max, int32_t n_unread = 0);
    // Share of the time spent in plain steps that explorations may cost.
    static constexpr double EXPLORE_BUDGET = 0.02;
    // A block drafted kd tokens, `accepted` of them reached the output, and
    // `ended_early` tells whether it ended before its length: a draft token
    // refused, or the draft declining to propose one (--draft-p-min).
    void observe_block(int32_t kd, int32_t accepted, bool ended_early);
    // A block's draft calls: the first one (with the catch-up; negative: a long
    // catch-up, not timed) and the mean of the later single-token steps
    // (n_steps of them; 0: none were taken).
    void observe_draft(double first_ms, double step_ms, int32_t n_steps) { costs.observe_draft(first_ms, step_ms, n_steps); }
    // A long catch-up, timed apart: the draft read n_tokens (in the target's tokens) in ms.
    void observe_catch_up(double ms, int32_t n_tokens) { costs.observe_catch_up(ms, n_tokens); }
    // A decode of n tokens took ms. `fair`: the target's decode before it had
    // the same size; the others pay llama.cpp's graph rebuild and stand in only
    // until a fair one.
    void observe_verify(int32_t n_tokens, double ms, bool fair) { costs.observe_verify(n_tokens, ms, fair); }
    // Use a fixed cost model (in target steps: a calibration's, or cost_model::linear) instead of
    // measured times, so that the chosen lengths depend on acceptance counts alone.
    void use_fixed_costs(const cost_model & steps) { costs.use_fixed(steps); }
    // Timed costs that start from a calibration's measurements (ms) instead of being measured
    // first: the first choice is the rate model's, no measuring blocks.
    void seed_costs(const cost_model & ms) { costs.seed(ms); }
    // Start the acceptance estimate from these decayed counts (before any block). measured: they
    // come from a calibration of this pair, so the first exploration of drafting after a run of
    // plain steps is held to EXPLORE_BUDGET as the later ones are (a guessed prior is explored
    // at once: a 96-token reply paid 5% for an exploration the calibration had already made).
    void set_acceptance_prior(double accepted, double rejected, bool measured = false);
    // Forget the acceptance estimate (its meaning changed, e.g. another
    // --draft-p-min), keeping the measured costs; explore again soon.
    void reset_acceptance();

    double acceptance() const { return acc_sum / (acc_sum + rej_sum); }

    // A proposal in hand whose n tokens each carry their own chance of acceptance (the n-gram
    // drafter's estimates by match length): how many of them to verify, 0 to hold it (a plain
    // target step instead). The costs are this tuner's; drafting them costs nothing more.
    // k_in_use: the draft tokens of the target's last decode (0: a plain step), which a block of
    // the same length follows without a graph rebuild.
    // rate_to_beat: what another source's block promises for this step, in this tuner's units.
    int32_t choose_for_proposal(const double * acceptance, int32_t n, int32_t k_in_use, double rate_to_beat = 0.0);
    // The tokens per unit time the rate model promises for the next block at its best length in
    // [1, k_max] where that beats plain steps, else 0 (a source that would not draft now).
    double expected_rate(int32_t k_max, int32_t n_unread) const;
    // The last proposal was held: a plain step followed. Every HELD_EXPLORE_MIN held
    // proposals (doubling to HELD_EXPLORE_MAX while explorations are refused) one is verified
    // anyway, its best length above 0, so that estimates which fell too low can rise again.
    void observe_held();
    static constexpr int32_t HELD_EXPLORE_MIN = 16;
    static constexpr int32_t HELD_EXPLORE_MAX = 128;

  private:
    // Blocks taken to time a block fairly: blocks cut short (by --draft-p-min,
    // say) are timed at their size, and if none reaches a second block of its
    // size a few tries are enough.
    static constexpr int32_t MEASURE_MAX_BLOCKS = 8;

    // The length to take while the costs the model needs are not measured yet.
    std::optional<int32_t> length_to_measure(int32_t k_max);
    length_choice fastest_length_now(int32_t k_max, int32_t n_unread) const;
    // Whether an exploration (its catch-up of n_unread tokens, and what its blocks cost over
    // plain steps) fits EXPLORE_BUDGET.
    bool worth_exploring(int32_t k, int32_t n_unread) const;
    // A draft step, as timed, costs a plain target step or more: no block can pay.
    bool draft_slower_than_target() const;

    cost_estimates costs;
    probe_schedule schedule;
    double acc_sum = 1.0; // decayed counts of accepted draft tokens and of rejections
    double rej_sum = 1.0; // (prior: a = 0.5)
    int32_t measuring_blocks = 0;
    bool prior_measured = false;  // the acceptance prior is a calibration's
    int32_t last_k = 0;           // the length taken last
    // The length in use for the switching cost: the model's last choice, or an
    // exploration's (its blocks are the last decodes the next choice follows).
    int32_t settled_k = 0;
    int32_t held = 0;                               // proposals held since the last exploration
    int32_t held_explore_every = HELD_EXPLORE_MIN;  // held proposals between explorations
    bool held_exploring = false;                    // the last block verified was an exploration
};

} // namespace cospec
