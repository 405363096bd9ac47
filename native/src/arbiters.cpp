// Built-in arbiters (target, FLy, AASD) and user callback arbiters.
#include "engine.h"
#include "internal.h"
#include "sampling.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <new>
#include <string>
#include <thread>

namespace {

// Plain speculative decoding: a mismatch always falls back to the target.
struct target_arbiter final : cospec_arbiter {
    const char * name() const override { return "target"; }
    int32_t kind() const override { return COSPEC_ARBITER_TARGET; }
    bool can_keep() const override { return false; }
    int32_t score(const cospec_block & block, float * p_keep) override {
        std::fill(p_keep, p_keep + block.n_draft, 0.0f);
        return 0;
    }
};

// FLy's training-free loose verification, as its reference implementation
// does it. A mismatch is a different wording rather than an error when the
// target keeps agreeing with the draft right after it (the deferred window:
// the next W-1 draft tokens match exactly) and the target itself was unsure
// there (the entropy gate). The last W positions of a block are never
// loosened, so a kept mismatch has i <= K - W - 1.
struct fly_arbiter final : cospec_arbiter {
    cospec_fly_params params;
    explicit fly_arbiter(cospec_fly_params p) : params(p) {}
    const char * name() const override { return "fly"; }
    int32_t kind() const override { return COSPEC_ARBITER_FLY; }
    int32_t score(const cospec_block & block, float * p_keep) override {
        const int32_t n = block.n_draft;
        const int32_t w = params.window;
        for (int32_t i = 0; i < n; ++i) {
            p_keep[i] = 0.0f;
            if (!block.mismatch[i] || i + w >= n) {
                continue;
            }
            bool window_matches = true;
            for (int32_t j = i + 1; j < i + w; ++j) {
                window_matches = window_matches && !block.mismatch[j];
            }
            if (!window_matches) {
                continue;
            }
            const float * row = block.target_logits + (size_t) i * block.n_vocab_target;
            const float h = cospec::top_k_entropy(row, block.n_vocab_target, params.entropy_top_k);
            p_keep[i] = h >= params.entropy_threshold ? 1.0f : 0.0f;
        }
        return 0;
    }
};

// AASD's conditional verification: a draft token the target finds likely enough stands, where
// "enough" falls as the target grows unsure (its entropy H); the target's own choice always passes.
// Past H = beta / alpha nats (1 at the defaults) the threshold is below zero: every draft token
// stands there, as the rule is written.
struct aasd_arbiter final : cospec_arbiter {
    cospec_aasd_params params;
    explicit aasd_arbiter(cospec_aasd_params p) : params(p) {}
    const char * name() const override { return "aasd"; }
    int32_t kind() const override { return COSPEC_ARBITER_AASD; }
    int32_t score(const cospec_block & block, float * p_keep) override {
        const int32_t n_vocab = block.n_vocab_target;
        for (int32_t i = 0; i < block.n_draft; ++i) {
            p_keep[i] = 0.0f;
            const cospec_token d = block.draft[i];
            if (!block.mismatch[i] || d < 0 || d >= n_vocab) {
                continue;
            }
            const float * row = block.target_logits + (size_t) i * n_vocab;
            const float top = *std::max_element(row, row + n_vocab);
            double sum = 0.0, weighted = 0.0;  // sum of e^(l - top) and of (l - top) e^(l - top)
            for (int32_t v = 0; v < n_vocab; ++v) {
                const double z = (double) row[v] - top;
                const double e = std::exp(z);
                if (e > 0.0) {  // a token the target excludes (-inf) adds nothing, not -inf * 0
                    sum += e;
                    weighted += z * e;
                }
            }
            const double entropy = std::log(sum) - weighted / sum;
            const double p_draft = std::exp((double) row[d] - top) / sum;  // as p_top: a tied top passes exactly
            const double p_top = 1.0 / sum;
            const double threshold = std::min((double) params.beta - (double) params.alpha * entropy, p_top);
            p_keep[i] = p_draft >= threshold ? 1.0f : 0.0f;
        }
        return 0;
    }
};

struct callback_arbiter final : cospec_arbiter {
    std::string label;
    cospec_arbiter_callbacks cb;
    void * user_data;
    callback_arbiter(const char * l, const cospec_arbiter_callbacks & c, void * u)
        : label(l ? l : "callback"), cb(c), user_data(u) {}
    const char * name() const override { return label.c_str(); }
    int32_t kind() const override { return COSPEC_ARBITER_CALLBACK; }
    bool needs_draft_logits() const override { return cb.needs_draft_logits; }
    void begin(const cospec_token * prompt, int32_t n) override {
        if (cb.begin) cb.begin(user_data, prompt, n);
    }
    void taken(const cospec_block & block, const cospec_decision * d, int32_t n) override {
        if (cb.taken) cb.taken(user_data, &block, d, n);
    }
    void reset() override {
        if (cb.reset) cb.reset(user_data);
    }
    int32_t score(const cospec_block & block, float * p_keep) override {
        return cb.decide(user_data, &block, p_keep);
    }
};

} // namespace

extern "C" {

cospec_fly_params cospec_fly_default_params(void) {
    cospec_fly_params p;
    // FLy's reference uses K = 15, W = 6: the first 9 of 15 positions can be
    // loosened. With this engine's default K = 8, W = 3 keeps that share (5 of 8).
    p.window = 3;
    p.entropy_threshold = 0.3f;
    p.entropy_top_k = 3;
    return p;
}

cospec_aasd_params cospec_aasd_default_params(void) {
    cospec_aasd_params p;
    p.alpha = 0.1f;
    p.beta = 0.1f;
    return p;
}

cospec_arbiter * cospec_arbiter_init_target(void) {
    cospec::clear_error();
    return new (std::nothrow) target_arbiter();
}

namespace {

int32_t refuse_rule(const char ** field, const char * rule, const char * name, const std::string & why) {
    if (field != nullptr) {
        *field = name;
    }
    return cospec::fail(COSPEC_ERR_INVALID_ARGUMENT, std::string(rule) + ": " + name + ": " + why);
}

} // namespace

int32_t cospec_fly_params_check(const cospec_fly_params * params, const char ** field) {
    cospec::clear_error();
    if (field != nullptr) {
        *field = "";
    }
    if (params->window < 1) {
        return refuse_rule(field, "fly", "window", "must be >= 1, got " + std::to_string(params->window));
    }
    if (!(params->entropy_threshold >= 0.0f) || !(params->entropy_threshold < 1e30f)) {
        return refuse_rule(field, "fly", "entropy_threshold", "must be a finite number >= 0");
    }
    if (params->entropy_top_k < 0) {
        return refuse_rule(field, "fly", "entropy_top_k", "must be >= 0 (0: the full entropy)");
    }
    return COSPEC_OK;
}

int32_t cospec_aasd_params_check(const cospec_aasd_params * params, const char ** field) {
    cospec::clear_error();
    if (field != nullptr) {
        *field = "";
    }
    if (!(params->alpha >= 0.0f && params->alpha < 1e30f)) {
        return refuse_rule(field, "aasd", "alpha", "must be a finite number >= 0");
    }
    if (!(params->beta >= 0.0f && params->beta <= 1.0f)) {
        return refuse_rule(field, "aasd", "beta", "must be in [0, 1]");
    }
    return COSPEC_OK;
}

cospec_arbiter * cospec_arbiter_init_fly(cospec_fly_params params) {
    if (cospec_fly_params_check(&params, nullptr) != COSPEC_OK) {
        return nullptr;
    }
    return new (std::nothrow) fly_arbiter(params);
}

cospec_arbiter * cospec_arbiter_init_aasd(cospec_aasd_params params) {
    if (cospec_aasd_params_check(&params, nullptr) != COSPEC_OK) {
        return nullptr;
    }
    return new (std::nothrow) aasd_arbiter(params);
}

cospec_arbiter * cospec_arbiter_init_callbacks(const char * name, const cospec_arbiter_callbacks * callbacks, void * user_data) {
    cospec::clear_error();
    if (callbacks == nullptr || callbacks->decide == nullptr) {
        cospec::fail(COSPEC_ERR_INVALID_ARGUMENT, "callback arbiter: a decide function is required");
        return nullptr;
    }
    return new (std::nothrow) callback_arbiter(name, *callbacks, user_data);
}

cospec_arbiter * cospec_arbiter_init_callback(const char * name, cospec_arbiter_fn fn, void * user_data) {
    cospec_arbiter_callbacks cb {};
    cb.decide = fn;
    cb.needs_draft_logits = true;
    return cospec_arbiter_init_callbacks(name, &cb, user_data);
}

void cospec_arbiter_free(cospec_arbiter * arbiter) {
    delete arbiter;
}

const char * cospec_arbiter_name(const cospec_arbiter * arbiter) {
    return arbiter ? arbiter->name() : "";
}

int32_t cospec_arbiter_get_kind(const cospec_arbiter * arbiter) {
    return arbiter != nullptr ? arbiter->kind() : -1;
}

const char * cospec_arbiter_kind_name(int32_t kind) {
    switch (kind) {
        case COSPEC_ARBITER_TARGET:   return "target";
        case COSPEC_ARBITER_FLY:      return "fly";
        case COSPEC_ARBITER_CALLBACK: return "callback";
        case COSPEC_ARBITER_FEATURES: return "features";
        case COSPEC_ARBITER_LORA:     return "lora";
        case COSPEC_ARBITER_AASD:     return "aasd";
        default:                      return nullptr;
    }
}

float cospec_arbiter_threshold(const cospec_arbiter * arbiter) {
    return arbiter ? arbiter->threshold() : 0.5f;
}

void cospec_arbiter_reset(cospec_arbiter * arbiter) {
    if (arbiter != nullptr) {
        arbiter->reset();
    }
}

bool cospec_arbiter_can_keep(const cospec_arbiter * arbiter) {
    return arbiter != nullptr && arbiter->can_keep();
}

const char * cospec_arbiter_meta(const cospec_arbiter * arbiter, const char * key) {
    return arbiter != nullptr && key != nullptr ? arbiter->meta(key) : nullptr;
}

// An arbiter that decodes on its engine's draft context: called from outside
// a generation, take the engine for the call, or refuse while another thread
// generates. Called back from the generation itself (a user arbiter scoring
// with it, as the training side records blocks), the loop is waiting on its
// verdict with the draft holding the block's context: go on.
static int32_t hold_engine_draft(const cospec_arbiter * arbiter, std::unique_lock<std::mutex> & lock) {
    if (!arbiter->uses_engine_draft() || arbiter->engine() == nullptr) {
        return COSPEC_OK;
    }
    if (arbiter->engine()->generating.load() == std::this_thread::get_id()) {
        return COSPEC_OK;
    }
    lock = std::unique_lock<std::mutex>(arbiter->engine()->busy, std::try_to_lock);
    if (!lock.owns_lock()) {
        return cospec::fail(COSPEC_ERR_INVALID_ARGUMENT, std::string("arbiter '") + arbiter->name() +
                                                             "' reads the engine's draft, which a generation is using");
    }
    return COSPEC_OK;
}

static int32_t check_block(const cospec_block * b) {
    if (b == nullptr || b->n_draft < 0 || b->n_vocab_target <= 0 || b->target == nullptr || b->target_logits == nullptr ||
        (b->n_draft > 0 && (b->draft == nullptr || b->mismatch == nullptr)) || b->n_context < 0 ||
        (b->n_context > 0 && b->context == nullptr)) {
        return cospec::fail(COSPEC_ERR_INVALID_ARGUMENT, "arbiter: incomplete block");
    }
    return COSPEC_OK;
}

int32_t cospec_arbiter_score(cospec_arbiter * arbiter, const cospec_block * block, float * p_keep) {
    cospec::clear_error();
    if (arbiter == nullptr || p_keep == nullptr) {
        return cospec::fail(COSPEC_ERR_INVALID_ARGUMENT, "arbiter: NULL arbiter or p_keep array");
    }
    if (const int32_t st = check_block(block); st != COSPEC_OK) {
        return st;
    }
    if (arbiter->needs_draft_logits() && block->n_draft > 0 && block->draft_logits == nullptr) {
        return cospec::fail(COSPEC_ERR_INVALID_ARGUMENT, std::string("arbiter '") + arbiter->name() + "' needs the draft's logits");
    }
    std::unique_lock<std::mutex> lock;
    if (const int32_t st = hold_engine_draft(arbiter, lock); st != COSPEC_OK) {
        return st;
    }
    try {
        if (const int32_t rc = arbiter->score(*block, p_keep); rc != 0) {
            const std::string why = cospec_last_error();
            return cospec::fail(COSPEC_ERR_ARBITER, std::string("arbiter '") + arbiter->name() + "' reported an error" +
                                                        (why.empty() ? "" : ": " + why));
        }
    } catch (const std::exception & e) {
        return cospec::fail(COSPEC_ERR_ARBITER, std::string("arbiter '") + arbiter->name() + "' failed: " + e.what());
    }
    return COSPEC_OK;
}

int32_t cospec_arbiter_head_inputs(cospec_arbiter * arbiter, const cospec_block * block, float * out, size_t out_size) {
    cospec::clear_error();
    if (arbiter == nullptr || out == nullptr) {
        return cospec::fail(COSPEC_ERR_INVALID_ARGUMENT, "arbiter: NULL arbiter or output");
    }
    if (const int32_t st = check_block(block); st != COSPEC_OK) {
        return st;
    }
    std::unique_lock<std::mutex> lock;
    if (const int32_t st = hold_engine_draft(arbiter, lock); st != COSPEC_OK) {
        return st;
    }
    try {
        return arbiter->head_inputs(*block, out, out_size);
    } catch (const std::exception & e) {
        return cospec::fail(COSPEC_ERR_ARBITER, std::string("arbiter '") + arbiter->name() + "' failed: " + e.what());
    }
}

float cospec_entropy(const float * logits, int32_t n_vocab, float temperature) {
    if (logits == nullptr || n_vocab <= 0) {
        return 0.0f;
    }
    return cospec::entropy(logits, n_vocab, temperature);
}

} // extern "C"
