#include "token_choice.h"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace cospec {

namespace {

using clock_type = std::chrono::steady_clock;

double ms_since(clock_type::time_point t0) {
    return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

} // namespace

token_chooser::token_chooser(const sampler_config & cfg, uint64_t seed, float repeat_penalty, int32_t repeat_last_n,
                             double & t_sample_ms)
    : cfg(cfg), is_greedy(!(cfg.temperature >= MIN_SAMPLING_TEMPERATURE)), rng(seed),
      penalty(repeat_penalty, repeat_last_n), t_sample_ms(t_sample_ms) {}

bool token_chooser::parse_grammar(const llama_vocab * vocab, const char * text, const char * root) {
    return grammar.parse(vocab, text, root);
}

llama_token token_chooser::choose(const float * raw, int32_t n, const std::vector<llama_token> & seq) {
    const auto t0 = clock_type::now();
    static const std::vector<llama_token> no_block;
    const float * logits = penalty.apply(raw, n, seq, no_block, 0);
    llama_token tok;
    if (is_greedy) {
        tok = grammar.greedy(logits, n);
    } else {
        const float * row = grammar.mask(logits, n);
        if (row == nullptr) {
            t_sample_ms += ms_since(t0);
            return -1;
        }
        sampling_probs(row, n, cfg, probs);
        tok = sample_from(probs, rng);
    }
    t_sample_ms += ms_since(t0);
    return tok;
}

llama_token token_chooser::draft(const float * row, int32_t n_shared, int32_t n_draft_vocab,
                                 const std::vector<llama_token> & seq, const std::vector<llama_token> & drafted, int32_t i,
                                 float p_min, std::vector<float> * q) {
    const auto t0 = clock_type::now();
    const float * chosen_from = penalty.apply(row, n_shared, seq, drafted, i);
    llama_token d = -1;
    if (is_greedy) {
        // The draft is unsure: verifying further guesses would waste target work.
        if (!(p_min > 0.0f && top_probability(row, n_draft_vocab) < p_min)) {
            d = draft_grammar.greedy(chosen_from, n_shared);
        }
    } else {
        const float * masked = draft_grammar.mask(chosen_from, n_shared);
        if (masked != nullptr) {
            sampling_probs(masked, n_shared, cfg, *q);
            d = sample_from(*q, rng);
        }
    }
    t_sample_ms += ms_since(t0);
    return d;
}

llama_token token_chooser::draft_free(const float * row, int32_t n, float p_min) {
    const auto t0 = clock_type::now();
    llama_token d = -1;
    if (is_greedy) {
        if (!(p_min > 0.0f && top_probability(row, n) < p_min)) {
            d = argmax(row, n);
        }
    } else {
        sampling_probs(row, n, cfg, probs);
        d = sample_from(probs, rng);
    }
    t_sample_ms += ms_since(t0);
    return d;
}

void token_chooser::trim(std::vector<llama_token> & proposal, const llama_vocab * vocab) {
    if (!grammar) {
        return;
    }
    grammar_state g = grammar.copy();
    size_t n = 0;
    while (n < proposal.size() && g.allows(proposal[n])) {
        g.accept(vocab, proposal[n]);
        if (llama_vocab_is_eog(vocab, proposal[n++])) {
            break; // the output ends there
        }
    }
    proposal.resize(n);
}

token_chooser::verdict token_chooser::judge(const float * raw, int32_t n, const std::vector<llama_token> & seq,
                                            const std::vector<llama_token> & drafted, int32_t j,
                                            const std::vector<float> * q) {
    const int32_t kd = (int32_t) drafted.size();
    const auto t0 = clock_type::now();
    // With a grammar the target chooses among the tokens it allows after drafted[0..j).
    const float * row = penalty.apply(raw, n, seq, drafted, j);
    verdict v {-1, false};
    if (is_greedy) {
        v.token = walk_grammar.greedy(row, n);
        v.mismatch = j < kd && drafted[j] != v.token;
        t_sample_ms += ms_since(t0);
        return v;
    }
    row = walk_grammar.mask(row, n);
    if (row == nullptr) {
        v.mismatch = j < kd;
    } else if (j == kd) {
        sampling_probs(row, n, cfg, probs);
        v.token = sample_from(probs, rng);
    } else if (q == nullptr) {
        sampling_probs(row, n, cfg, probs);
        const llama_token d = drafted[j];
        if (uniform01(rng) < probs[d]) {
            v.token = d;
        } else {
            residual = probs;
            residual[d] = 0.0f;
            const bool left = std::any_of(residual.begin(), residual.end(), [](float x) { return x > 0.0f; });
            v.token = sample_from(left ? residual : probs, rng);
            v.mismatch = true;
        }
    } else {
        sampling_probs(row, n, cfg, probs);
        const llama_token d = drafted[j];
        const double u = uniform01(rng);
        if (u * (*q)[d] < probs[d]) { // u < p/q without dividing by a tiny q
            v.token = d;
        } else {
            const int32_t n_q = (int32_t) q->size();
            residual.assign(n, 0.0f);
            double mass = 0.0;
            for (int32_t t = 0; t < n; ++t) {
                const float qt = t < n_q ? (*q)[t] : 0.0f;
                residual[t] = std::max(0.0f, probs[t] - qt);
                mass += residual[t];
            }
            v.token = sample_from(mass > 0.0 ? residual : probs, rng);
            v.mismatch = true;
        }
    }
    t_sample_ms += ms_since(t0);
    return v;
}

} // namespace cospec
