#include "grammar.h"

#include "sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace cospec {

bool grammar_state::parse(const llama_vocab * vocab, const char * grammar, const char * root) {
    sampler.reset(llama_sampler_init_grammar(vocab, grammar, root != nullptr ? root : "root"));
    return sampler != nullptr;
}

grammar_state grammar_state::copy() const {
    grammar_state out;
    if (sampler) {
        out.sampler.reset(llama_sampler_clone(sampler.get()));
    }
    return out;
}

bool grammar_state::allows(llama_token tok) {
    if (!sampler) {
        return true;
    }
    llama_token_data one {tok, 0.0f, 0.0f};
    llama_token_data_array arr {&one, 1, -1, false};
    llama_sampler_apply(sampler.get(), &arr);
    return std::isfinite(one.logit);
}

const float * grammar_state::mask(const float * row, int32_t n) {
    if (!sampler) {
        return row;
    }
    candidates.resize((size_t) n);
    for (int32_t i = 0; i < n; ++i) {
        candidates[i] = {i, row[i], 0.0f};
    }
    llama_token_data_array arr {candidates.data(), (size_t) n, -1, false};
    llama_sampler_apply(sampler.get(), &arr);
    masked.assign((size_t) n, -INFINITY);
    bool any = false;
    for (size_t i = 0; i < arr.size; ++i) {
        if (arr.data[i].id >= 0 && arr.data[i].id < n) {
            masked[(size_t) arr.data[i].id] = arr.data[i].logit;
            any = any || std::isfinite(arr.data[i].logit);
        }
    }
    return any ? masked.data() : nullptr;
}

llama_token grammar_state::greedy(const float * row, int32_t n) {
    const llama_token best = argmax(row, n);
    if (!sampler || allows(best)) {
        return best;
    }
    // The likeliest tokens one by one before a pass over the whole vocabulary: the first one the
    // grammar allows is the masked row's argmax (equal logits: the lower id, as argmax takes).
    const int32_t k = std::min(n, GREEDY_CANDIDATES);
    order.resize((size_t) n);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [row](int32_t a, int32_t b) {
        return row[a] > row[b] || (row[a] == row[b] && a < b);
    });
    for (int32_t i = 1; i < k; ++i) { // order[0] is `best`, refused
        if (allows(order[(size_t) i])) {
            return order[(size_t) i];
        }
    }
    const float * allowed = mask(row, n);
    return allowed != nullptr ? argmax(allowed, n) : -1;
}

void grammar_state::accept(const llama_vocab * vocab, llama_token tok) {
    if (sampler && !llama_vocab_is_eog(vocab, tok)) {
        llama_sampler_accept(sampler.get(), tok);
    }
}

} // namespace cospec
