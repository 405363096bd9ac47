#include "calibration.h"

#include "block_sources.h"
#include "decoder.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <string>
#include <vector>

namespace cospec {

namespace {

// Verify batch sizes timed; the others are interpolated (a CPU's cost is close to linear in the
// batch), and those past the last extrapolated along its last segment.
constexpr int32_t MEASURED_SIZES[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 13, 17, 25, 33};
// Timed decodes per size (after one untimed decode of that size, which pays llama.cpp's graph
// rebuild); the median is kept, so one decode slowed by another process does not count.
constexpr int32_t TIMED_REPEATS = 3;
// A long catch-up of the draft is timed on this many tokens.
constexpr int32_t CATCH_UP_TOKENS = 16;
// Tokens beyond the context a measurement decodes (the largest verify batch).
constexpr int32_t EXTRA_TOKENS = MAX_BLOCK_BATCH;
// A calibrated acceptance prior is worth this many rejections' weight (the tuner's counts decay
// by 0.9 a block, so a call's own blocks take over within ten or so).
constexpr double PRIOR_REJECTIONS = 2.0;
constexpr double MAX_PRIOR_ACCEPTANCE = 0.99;

bool finite_in(double v, double lo, double hi) {
    return std::isfinite(v) && v >= lo && v <= hi;
}

// An acceptance is a chance, or negative where it was not measured.
bool acceptance_ok(double a) {
    return std::isfinite(a) && a <= 1.0;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// Times decodes of n tokens after a fixed context on one model.
class decode_timer {
  public:
    decode_timer(cospec_engine & e, model_slot & s, std::vector<llama_token> tokens, size_t n_context)
        : s(s), tokens(std::move(tokens)), n_context(n_context), calls(e, st, stop) {}

    // The median time of decoding n tokens right after the context (ms); negative: a status.
    double time(int32_t n, int32_t & status) {
        std::vector<double> samples;
        for (int32_t i = 0; i <= TIMED_REPEATS && status == COSPEC_OK; ++i) {
            double ms = 0.0;
            status = once(n, ms);
            if (i > 0) {
                samples.push_back(ms);
            }
        }
        return status == COSPEC_OK ? median(samples) : -1.0;
    }

  private:
    int32_t once(int32_t n, double & ms) {
        double t_sync = 0.0;
        if (int32_t status = calls.sync_to(s, tokens, n_context, false, t_sync, nullptr); status != COSPEC_OK) {
            return status;
        }
        if (calls.stopped()) {
            return fail(COSPEC_ERR_CANCELLED, "the calibration was aborted");
        }
        calls.checkpoint(s); // a recurrent memory rolls each batch back from here
        fill_batch(s, tokens.data() + n_context, n, (llama_pos) n_context, true);
        if (int32_t status = calls.decode(s, ms, (llama_pos) n_context); status != COSPEC_OK) {
            return status;
        }
        if (calls.stopped()) {
            return fail(COSPEC_ERR_CANCELLED, "the calibration was aborted");
        }
        s.cached.insert(s.cached.end(), tokens.begin() + (std::ptrdiff_t) n_context,
                        tokens.begin() + (std::ptrdiff_t) n_context + n);
        return COSPEC_OK;
    }

    model_slot & s;
    std::vector<llama_token> tokens;
    size_t n_context;
    cospec_stats st {};
    int32_t stop = COSPEC_STOP_NONE;
    decoder calls;
};

// The context and EXTRA_TOKENS more for model s (tokens of its vocabulary; their ids do not
// change a dense model's cost).
std::vector<llama_token> timing_tokens(const cospec_token * context, int32_t n_context, int32_t n_vocab) {
    std::vector<llama_token> out;
    out.reserve((size_t) n_context + EXTRA_TOKENS);
    for (int32_t i = 0; i < n_context + EXTRA_TOKENS; ++i) {
        out.push_back(context[i % n_context] % n_vocab);
    }
    return out;
}

int32_t measure(cospec_engine & e, const cospec_token * context, int32_t n_context, cospec_calibration & out) {
    out = cospec_calibration {};
    out.version = COSPEC_CALIBRATION_VERSION;
    int32_t status = COSPEC_OK;
    {
        decode_timer target(e, e.target, timing_tokens(context, n_context, e.target.n_vocab), (size_t) n_context);
        double measured[MAX_BLOCK_BATCH + 1] = {};
        for (const int32_t n : MEASURED_SIZES) {
            measured[n] = target.time(n, status);
            if (status != COSPEC_OK) {
                return status;
            }
        }
        const double step = std::max(measured[1], 1e-6);
        out.target_step_ms = step;
        int32_t lo = 1;
        for (int32_t n = 1; n <= MAX_BLOCK_BATCH; ++n) {
            if (measured[n] > 0.0) {
                lo = n;
                out.verify[n] = measured[n] / step;
                continue;
            }
            int32_t hi = n + 1;
            while (hi <= MAX_BLOCK_BATCH && measured[hi] <= 0.0) {
                ++hi;
            }
            int32_t a = lo, b = hi;
            if (hi > MAX_BLOCK_BATCH) { // past the last size: along the last segment
                b = lo;
                a = lo - 1;
                while (a > 1 && measured[a] <= 0.0) {
                    --a;
                }
            }
            const double slope = (measured[b] - measured[a]) / (b - a);
            out.verify[n] = (measured[a] + slope * (n - a)) / step;
        }
        out.verify[1] = 1.0;
        for (int32_t n = 2; n <= MAX_BLOCK_BATCH; ++n) {
            out.verify[n] = std::max(out.verify[n], out.verify[n - 1]); // noise never makes a larger batch cheaper
        }
    }
    if (e.has_draft) {
        decode_timer draft(e, e.draft, timing_tokens(context, n_context, e.draft.n_vocab), (size_t) n_context);
        const double step = draft.time(1, status);
        const double first = status == COSPEC_OK ? draft.time((int32_t) BLOCK_CATCH_UP, status) : 0.0;
        const double catch_up = status == COSPEC_OK ? draft.time(CATCH_UP_TOKENS, status) : 0.0;
        if (status != COSPEC_OK) {
            return status;
        }
        out.draft_step = step / out.target_step_ms;
        out.draft_first = std::max(first, step) / out.target_step_ms;
        out.catch_up = catch_up / CATCH_UP_TOKENS / out.target_step_ms;
    }
    out.draft_acceptance = out.draft_acceptance_sampled = -1.0;
    for (double & a : out.ngram_acceptance) {
        a = -1.0;
    }
    return COSPEC_OK;
}

} // namespace

std::string calibration_problem(const cospec_calibration & c) {
    if (c.version != COSPEC_CALIBRATION_VERSION) {
        return "calibration format version " + std::to_string(c.version) + ", this engine reads version " +
               std::to_string(COSPEC_CALIBRATION_VERSION);
    }
    if (!finite_in(c.target_step_ms, 1e-6, 1e7)) {
        return "target_step_ms must be a positive number of milliseconds";
    }
    if (!finite_in(c.verify[1], 0.999, 1.001)) {
        return "verify[1] must be 1 (costs are in target steps)";
    }
    for (int32_t n = 2; n <= MAX_BLOCK_BATCH; ++n) {
        if (!finite_in(c.verify[n], 0.0, 1e4)) {
            return "verify[" + std::to_string(n) + "] must be a finite cost in target steps";
        }
    }
    if (!finite_in(c.draft_first, 0.0, 1e4) || !finite_in(c.draft_step, 0.0, 1e4) || !finite_in(c.catch_up, 0.0, 1e4)) {
        return "draft_first, draft_step and catch_up must be finite costs >= 0 in target steps";
    }
    if (!acceptance_ok(c.draft_acceptance) || !acceptance_ok(c.draft_acceptance_sampled)) {
        return "draft_acceptance and draft_acceptance_sampled must be chances in [0, 1] (negative: not measured)";
    }
    for (const double a : c.ngram_acceptance) {
        if (!acceptance_ok(a)) {
            return "ngram_acceptance must hold chances in [0, 1] (negative: not measured)";
        }
    }
    return {};
}

cost_model calibrated_steps(const cospec_calibration & c) {
    cost_model m;
    m.first_draft = c.draft_first;
    m.draft_step = c.draft_step;
    m.catch_up = c.catch_up;
    for (int32_t n = 1; n <= MAX_BLOCK_BATCH; ++n) {
        m.verify[n] = c.verify[n];
    }
    return m;
}

cost_model calibrated_ms(const cospec_calibration & c) {
    cost_model m = calibrated_steps(c);
    m.first_draft *= c.target_step_ms;
    m.draft_step *= c.target_step_ms;
    m.catch_up *= c.target_step_ms;
    for (int32_t n = 1; n <= MAX_BLOCK_BATCH; ++n) {
        m.verify[n] *= c.target_step_ms;
    }
    return m;
}

acceptance_prior prior_of(double a) {
    a = std::clamp(a, 0.0, MAX_PRIOR_ACCEPTANCE);
    return {PRIOR_REJECTIONS * a / (1.0 - a), PRIOR_REJECTIONS};
}

cost_model timing_free_costs(const cospec_engine & e, const cospec_generate_params & p, bool arbiter_keeps) {
    const cospec_arbiter * arbiter = arbiter_keeps ? p.arbiter : nullptr;
    const std::optional<double> trained_verify = arbiter != nullptr ? arbiter->trained_verify_cost() : std::nullopt;
    const std::optional<double> trained_draft = arbiter != nullptr ? arbiter->trained_draft_cost() : std::nullopt;
    cost_model m;
    if (trained_verify) {
        // A learned arbiter decides in the blocks its states were drafted in: the linear model it
        // recorded (its draft_cost, 0 for the pair's parameter ratio), on any machine.
        m = cost_model::linear(trained_draft.value_or(e.draft_cost_ratio), *trained_verify);
    } else if (e.calibrated) {
        m = calibrated_steps(e.calibration);
        if (!e.has_draft || m.draft_step <= 0.0) {
            m.first_draft = m.draft_step = e.draft_cost_ratio;
        }
    } else {
        m = cost_model::linear(e.draft_cost_ratio, draft_tuner::FIXED_VERIFY_MARGINAL);
    }
    if (p.draft_cost > 0.0f) {
        m.first_draft = m.draft_step = p.draft_cost;
    }
    if (p.verify_cost >= 0.0f) {
        const cost_model linear = cost_model::linear(0.0, p.verify_cost);
        std::copy(std::begin(linear.verify), std::end(linear.verify), std::begin(m.verify));
    }
    return m;
}

cost_model lookup_costs(const cospec_engine & e, const cospec_generate_params & p) {
    cost_model m = e.calibrated ? calibrated_steps(e.calibration) : cost_model::linear(0.0, draft_tuner::FIXED_VERIFY_MARGINAL);
    if (p.verify_cost >= 0.0f) {
        m = cost_model::linear(0.0, p.verify_cost);
    }
    m.first_draft = m.draft_step = 0.0; // the n-gram source prices its lookup itself
    m.catch_up = 0.0;
    return m;
}

} // namespace cospec

extern "C" {

int32_t cospec_engine_measure_costs(cospec_engine * engine, const cospec_token * context, int32_t n_context,
                                    cospec_calibration * out) {
    cospec::clear_error();
    if (engine == nullptr || context == nullptr || out == nullptr || n_context <= 0) {
        return cospec::fail(COSPEC_ERR_INVALID_ARGUMENT, "cospec_engine_measure_costs: a NULL argument or an empty context");
    }
    for (int32_t i = 0; i < n_context; ++i) {
        if (context[i] < 0 || context[i] >= engine->target.n_vocab) {
            return cospec::fail(COSPEC_ERR_INVALID_ARGUMENT, "context token " + std::to_string(context[i]) +
                                                                 " is outside the target's vocabulary");
        }
    }
    if ((int64_t) n_context + cospec::EXTRA_TOKENS >= engine->n_ctx) {
        return cospec::fail(COSPEC_ERR_CONTEXT_FULL, "the calibration context (" + std::to_string(n_context) +
                                                         " tokens) and its 64-token batches do not fit the context of " +
                                                         std::to_string(engine->n_ctx));
    }
    std::unique_lock<std::mutex> lock(engine->busy, std::try_to_lock);
    if (!lock.owns_lock()) {
        return cospec::fail(COSPEC_ERR_INVALID_ARGUMENT, "a generation is running on this engine");
    }
    engine->abort_flag.store(false);
    int32_t status;
    try {
        status = cospec::measure(*engine, context, n_context, *out);
    } catch (const std::exception & ex) {
        status = cospec::fail(COSPEC_ERR_INTERNAL, std::string("calibration failed: ") + ex.what());
    }
    for (model_slot * s : {&engine->target, &engine->draft}) {
        if (s->ctx != nullptr) {
            s->clear_cache(); // its tail holds timing tokens, not text
        }
    }
    engine->abort_flag.store(false);
    return status;
}

int32_t cospec_engine_set_calibration(cospec_engine * engine, const cospec_calibration * calibration) {
    cospec::clear_error();
    if (engine == nullptr) {
        return cospec::fail(COSPEC_ERR_INVALID_ARGUMENT, "cospec_engine_set_calibration: engine is NULL");
    }
    if (calibration != nullptr) {
        if (const std::string why = cospec::calibration_problem(*calibration); !why.empty()) {
            return cospec::fail(COSPEC_ERR_INVALID_ARGUMENT, "calibration: " + why);
        }
    }
    std::unique_lock<std::mutex> lock(engine->busy, std::try_to_lock);
    if (!lock.owns_lock()) {
        return cospec::fail(COSPEC_ERR_INVALID_ARGUMENT, "a generation is running on this engine");
    }
    // The tuners start afresh either way: estimates learned under another calibration are not its.
    engine->tuner = cospec::draft_tuner();
    engine->ngram_tuner = cospec::draft_tuner();
    engine->calibrated = calibration != nullptr;
    if (calibration == nullptr) {
        engine->calibration = cospec_calibration {};
        engine->ngram.set_prior(nullptr);
        return COSPEC_OK;
    }
    engine->calibration = *calibration;
    const cospec::cost_model ms = cospec::calibrated_ms(*calibration);
    engine->tuner.seed_costs(ms);
    engine->ngram_tuner.seed_costs(ms);
    if (calibration->draft_acceptance >= 0.0) {
        const cospec::acceptance_prior prior = cospec::prior_of(calibration->draft_acceptance);
        engine->tuner.set_acceptance_prior(prior.accepted, prior.rejected, true);
    }
    engine->ngram.set_prior(calibration->ngram_acceptance);
    return COSPEC_OK;
}

bool cospec_engine_get_calibration(const cospec_engine * engine, cospec_calibration * out) {
    if (engine == nullptr || out == nullptr || !engine->calibrated) {
        return false;
    }
    *out = engine->calibration;
    double learned[COSPEC_N_NGRAM_BUCKETS];
    engine->ngram.monotone_acceptance(learned);
    for (int32_t b = 0; b < COSPEC_N_NGRAM_BUCKETS; ++b) {
        if (learned[b] >= 0.0) {
            out->ngram_acceptance[b] = learned[b];
        }
    }
    return true;
}

} // extern "C"
