// Built-in arbiters and the callback arbiter.
#include "internal.h"
#include "sampling.h"

#include <cstring>
#include <new>
#include <string>

namespace {

// Plain speculative decoding: a mismatch always falls back to the target.
struct target_arbiter final : cospec_arbiter {
    const char * name() const override { return "target"; }
    bool always_rejects() const override { return true; }
    int32_t decide(const cospec_block & block, uint8_t * keep) override {
        std::memset(keep, 0, (size_t) block.n_draft);
        return 0;
    }
};

// FLy's training-free loose verification. A mismatch is a different wording
// rather than an error when the target keeps agreeing with the draft right
// after it (the deferred window) and the target itself was unsure there (the
// entropy gate). Positions whose window would run past the block are never kept.
struct fly_arbiter final : cospec_arbiter {
    cospec_fly_params params;
    explicit fly_arbiter(cospec_fly_params p) : params(p) {}
    const char * name() const override { return "fly"; }
    int32_t decide(const cospec_block & block, uint8_t * keep) override {
        const int32_t n = block.n_draft;
        const int32_t w = params.window;
        for (int32_t i = 0; i < n; ++i) {
            keep[i] = 0;
            if (!block.mismatch[i] || i >= n - w) {
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
            keep[i] = cospec::entropy(row, block.n_vocab_target, 1.0f) >= params.entropy_threshold;
        }
        return 0;
    }
};

struct callback_arbiter final : cospec_arbiter {
    std::string label;
    cospec_arbiter_fn fn;
    void * user_data;
    callback_arbiter(const char * l, cospec_arbiter_fn f, void * u) : label(l ? l : "callback"), fn(f), user_data(u) {}
    const char * name() const override { return label.c_str(); }
    int32_t decide(const cospec_block & block, uint8_t * keep) override {
        return fn(user_data, &block, keep);
    }
};

} // namespace

extern "C" {

cospec_fly_params cospec_fly_default_params(void) {
    cospec_fly_params p;
    p.window = 6;
    p.entropy_threshold = 0.3f;
    return p;
}

cospec_arbiter * cospec_arbiter_init_target(void) {
    cospec::clear_error();
    return new (std::nothrow) target_arbiter();
}

cospec_arbiter * cospec_arbiter_init_fly(cospec_fly_params params) {
    cospec::clear_error();
    if (params.window < 1) {
        cospec::fail(COSPEC_ERR_INVALID_ARGUMENT, "fly: window must be at least 1, got " + std::to_string(params.window));
        return nullptr;
    }
    if (!(params.entropy_threshold >= 0.0f)) {
        cospec::fail(COSPEC_ERR_INVALID_ARGUMENT, "fly: entropy_threshold must be a non-negative number");
        return nullptr;
    }
    return new (std::nothrow) fly_arbiter(params);
}

cospec_arbiter * cospec_arbiter_init_callback(const char * name, cospec_arbiter_fn fn, void * user_data) {
    cospec::clear_error();
    if (fn == nullptr) {
        cospec::fail(COSPEC_ERR_INVALID_ARGUMENT, "callback arbiter: fn is NULL");
        return nullptr;
    }
    return new (std::nothrow) callback_arbiter(name, fn, user_data);
}

void cospec_arbiter_free(cospec_arbiter * arbiter) {
    delete arbiter;
}

const char * cospec_arbiter_name(const cospec_arbiter * arbiter) {
    return arbiter ? arbiter->name() : "";
}

static int32_t check_block(const cospec_block * b) {
    if (b == nullptr || b->n_draft < 0 || b->n_vocab_target <= 0 || b->target == nullptr || b->target_logits == nullptr ||
        (b->n_draft > 0 && (b->draft == nullptr || b->mismatch == nullptr))) {
        return cospec::fail(COSPEC_ERR_INVALID_ARGUMENT, "arbiter: incomplete block");
    }
    return COSPEC_OK;
}

int32_t cospec_arbiter_decide(cospec_arbiter * arbiter, const cospec_block * block, uint8_t * keep) {
    cospec::clear_error();
    if (arbiter == nullptr || keep == nullptr) {
        return cospec::fail(COSPEC_ERR_INVALID_ARGUMENT, "arbiter: NULL arbiter or keep array");
    }
    if (const int32_t st = check_block(block); st != COSPEC_OK) {
        return st;
    }
    try {
        if (arbiter->decide(*block, keep) != 0) {
            return cospec::fail(COSPEC_ERR_ARBITER, std::string("arbiter '") + arbiter->name() + "' reported an error");
        }
    } catch (const std::exception & e) {
        return cospec::fail(COSPEC_ERR_ARBITER, std::string("arbiter '") + arbiter->name() + "' failed: " + e.what());
    }
    return COSPEC_OK;
}

float cospec_entropy(const float * logits, int32_t n_vocab, float temperature) {
    if (logits == nullptr || n_vocab <= 0) {
        return 0.0f;
    }
    return cospec::entropy(logits, n_vocab, temperature);
}

} // extern "C"
