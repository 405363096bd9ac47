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
#pragma once

#include "cospec.h"

#include <cstdint>

namespace cospec {

class draft_tuner {
  public:
    static constexpr int32_t MAX_BATCH = 64;
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

    // Draft length for the next block, in [0, k_max].
    int32_t choose(int32_t k_max);
    // A block drafted kd tokens, `accepted` of them reached the output, and
    // `ended_early` tells whether it ended before its length: a draft token
    // refused, or the draft declining to propose one (--draft-p-min).
    void observe_block(int32_t kd, int32_t accepted, bool ended_early);
    // A block's draft calls: the first one (with the catch-up; negative: a long
    // catch-up, not timed) and the mean of the later single-token steps
    // (n_steps of them; 0: none were taken).
    void observe_draft(double first_ms, double step_ms, int32_t n_steps);
    // A decode of n tokens took ms. `fair`: the target's decode before it had
    // the same size; the others pay llama.cpp's graph rebuild and stand in only
    // until a fair one.
    void observe_verify(int32_t n_tokens, double ms, bool fair);
    // Use a fixed cost model instead of measured times, so that the chosen
    // lengths depend on acceptance counts alone: a draft step costs
    // draft_cost target steps, verifying n tokens 1 + (n - 1) * verify_marginal.
    void use_fixed_costs(double draft_cost, double verify_marginal);
    // Start the acceptance estimate from these decayed counts (before any block).
    void set_acceptance_prior(double accepted, double rejected);
    // Forget the acceptance estimate (its meaning changed, e.g. another
    // --draft-p-min), keeping the measured costs; explore again soon.
    void reset_acceptance();

    double acceptance() const { return acc_sum / (acc_sum + rej_sum); }

  private:
    double verify_cost(int32_t n) const;
    bool fresh(int32_t n) const; // t_verify[n] was measured within STALE_AFTER steps

    double acc_sum = 1.0; // decayed counts of accepted draft tokens and of rejections
    double rej_sum = 1.0; // (prior: a = 0.5)
    double t_draft = -1.0;       // a draft step after the block's first
    double t_draft_first = -1.0; // the block's first draft call, catch-up included
    double t_verify[MAX_BATCH + 1] = {};
    bool verify_fair[MAX_BATCH + 1] = {}; // t_verify[n] comes from fair samples
    int64_t sampled_at[MAX_BATCH + 1] = {}; // `clock` at t_verify[n]'s last sample
    int64_t clock = 0;                      // blocks and plain steps observed
    bool probe_long = false;                // the last probe while drafting timed the longest length
    int32_t measuring_blocks = 0;         // blocks taken to time a block fairly
    static constexpr int32_t MEASURE_MAX_BLOCKS = 8;
    int64_t since_explore = 0;          // steps since the last exploration or probe, or switch
    int64_t explore_every = EXPLORE_MIN; // steps between explorations while plain steps win
    bool exploring = false;             // the last blocks chosen were an exploration
    int32_t plain_probe_left = 0;       // plain steps still to take in a probe of their cost
    int32_t explore_left = 0;           // blocks still to take in an exploration
    int32_t last_k = 0;
    int32_t settled_k = 0;              // the last length the model chose (not a probe's)
    int64_t probe_every = EXPLORE_MIN;  // blocks between probes of plain steps while drafting
    bool probing = false;               // the last chosen plain steps were such a probe
    bool fixed_costs = false;
    bool declined_whole = false;        // the last block drafted nothing: the draft declined (p-min)

    // While drafting does not pay, two blocks in explore_every still draft (of
    // the best length above 0), to see whether the draft has started agreeing
    // and what blocks cost now. Each such block costs a draft catch-up and a
    // longer verify, so the interval doubles after every
    // exploration that confirms plain steps (up to EXPLORE_MAX), and goes back
    // to EXPLORE_MIN once drafting pays. While drafting, the probe of a plain
    // step's cost is two plain steps (the first after a block is not a fair
    // sample, see generate.cpp); its interval doubles the same way while each
    // probe confirms drafting: at 2 plain steps and 2 graph rebuilds per 16
    // blocks (the starting interval) the probes cost the demo pair ~2% against
    // fixed K.
    static constexpr int64_t EXPLORE_MIN = 16;
    // A block of another length than the last step's costs llama.cpp a graph
    // rebuild for the target's verify (and for the plain step after it), in
    // target steps; measured with the demo pair on a 2-core CPU: 0.2-0.4 (a
    // GPU build's graph capture costs more). Without it a tuner that changed K
    // every few blocks paid ~0.2 ms a block more than fixed K (bench/RESULTS.md).
    static constexpr double SWITCH_COST = 0.3;
    static constexpr int64_t EXPLORE_MAX = 128;
    // Steps after which a measured cost is stale. The probes refresh a plain
    // step's and the longest length's at least every 2 * EXPLORE_MAX steps.
    static constexpr int64_t STALE_AFTER = 4 * EXPLORE_MAX;
    // Steps within which a new sample of a size is averaged with its estimate.
    static constexpr int64_t AVERAGE_WITHIN = EXPLORE_MIN;
};

} // namespace cospec
