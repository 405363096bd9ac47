// Teacher-forced scoring: every position's logits for a given token sequence,
// for converter parity checks and draft agreement measurements.
#include "engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

using cospec::fail;

int32_t cospec_score(cospec_engine * engine, int32_t which, const cospec_token * tokens, int32_t n_tokens,
                     float * logits, size_t logits_size) {
    cospec::clear_error();
    const int32_t n_vocab = cospec_engine_n_vocab_of(engine, which);
    if (n_vocab == 0) {
        return fail(which == 1 && engine != nullptr ? COSPEC_ERR_NO_DRAFT : COSPEC_ERR_INVALID_ARGUMENT,
                    "cospec_score: no such model (which = " + std::to_string(which) + ")");
    }
    if (tokens == nullptr || n_tokens <= 0 || logits == nullptr) {
        return fail(COSPEC_ERR_INVALID_ARGUMENT, "cospec_score: tokens and logits are required");
    }
    if (logits_size / (size_t) n_vocab < (size_t) n_tokens) {
        return fail(COSPEC_ERR_INVALID_ARGUMENT, "cospec_score: logits has room for " + std::to_string(logits_size) +
                                                     " floats, " + std::to_string((size_t) n_tokens * n_vocab) + " needed");
    }
    if (n_tokens > engine->n_ctx) {
        return fail(COSPEC_ERR_CONTEXT_FULL, "cospec_score: " + std::to_string(n_tokens) +
                                                 " tokens do not fit the context window of " + std::to_string(engine->n_ctx));
    }
    for (int32_t i = 0; i < n_tokens; ++i) {
        if (tokens[i] < 0 || tokens[i] >= n_vocab) {
            return fail(COSPEC_ERR_INVALID_ARGUMENT, "cospec_score: token " + std::to_string(tokens[i]) + " at position " +
                                                         std::to_string(i) + " is outside the vocabulary");
        }
    }
    std::unique_lock<std::mutex> lock(engine->busy, std::try_to_lock);
    if (!lock.owns_lock()) {
        return fail(COSPEC_ERR_INVALID_ARGUMENT, "another generation is already running on this engine");
    }
    engine->abort_flag.store(false);
    model_slot & s = which == 0 ? engine->target : engine->draft;
    // Start from an empty cache: every position's logits must be computed now.
    s.clear_cache();
    if (which == 0) {
        engine->head.mark_stale(); // the head heard a text the target's cache no longer holds
    }
    for (int32_t done = 0; done < n_tokens;) {
        const int32_t chunk = std::min(engine->n_batch, n_tokens - done);
        cospec::fill_batch(s, tokens + done, chunk, done, true);
        const int32_t ret = llama_decode(s.ctx, s.batch);
        if (ret != 0) {
            s.clear_cache();
            if (ret == 2 || engine->abort_flag.load()) {
                return fail(COSPEC_ERR_CANCELLED, "cospec_score: aborted");
            }
            return fail(ret == 1 ? COSPEC_ERR_CONTEXT_FULL : COSPEC_ERR_DECODE,
                        "cospec_score: llama_decode failed with code " + std::to_string(ret));
        }
        for (int32_t i = 0; i < chunk; ++i) {
            const float * row = llama_get_logits_ith(s.ctx, i);
            if (row == nullptr) {
                return fail(COSPEC_ERR_INTERNAL, "cospec_score: llama.cpp returned no logits");
            }
            for (int32_t v = 0; v < n_vocab; ++v) {
                if (!std::isfinite(row[v])) {
                    s.clear_cache();
                    return fail(COSPEC_ERR_DECODE, "cospec_score: the model computed non-finite logits "
                                                   "(corrupt weights or metadata?)");
                }
            }
            std::memcpy(logits + (size_t) (done + i) * n_vocab, row, sizeof(float) * (size_t) n_vocab);
        }
        s.cached.insert(s.cached.end(), tokens + done, tokens + done + chunk);
        done += chunk;
    }
    return COSPEC_OK;
}
