// A pair's calibration (cospec.h's cospec_calibration) in the engine: the checks that a stored
// one passes before use, and the cost models the tuners take from it.
#pragma once

#include "draft_tuner.h"
#include "engine.h"

#include <optional>
#include <string>

namespace cospec {

// Why a calibration cannot be used (empty: it can): version, ranges, finiteness.
std::string calibration_problem(const cospec_calibration & c);

// Its costs in target steps, the fixed cost model of the timing-free lengths.
cost_model calibrated_steps(const cospec_calibration & c);
// Its costs in milliseconds, the seed of the timed estimates.
cost_model calibrated_ms(const cospec_calibration & c);

// A decayed-count acceptance prior worth a few blocks (accepted, rejected) at chance a.
struct acceptance_prior {
    double accepted;
    double rejected;
};
acceptance_prior prior_of(double a);

// The cost model of the draft model's blocks in a call whose block lengths may not depend on
// timing, in target steps: a learned arbiter's recorded linear model where it has one (it decides
// in the blocks its states were drafted in), else the engine's calibration, else the pair's
// parameter ratio and COSPEC_DEFAULT_VERIFY_COST; the call's settings (draft_cost, verify_cost)
// override any of them. arbiter_keeps: the call's arbiter decides mismatches (not abstaining).
cost_model timing_free_costs(const cospec_engine & e, const cospec_generate_params & p, bool arbiter_keeps);
// The same for the n-gram drafter's blocks, which no arbiter decides: the calibration's verify
// costs (else the default), or the call's verify_cost.
cost_model lookup_costs(const cospec_engine & e, const cospec_generate_params & p);

} // namespace cospec
