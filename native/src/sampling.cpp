#include "sampling.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

namespace cospec {

const float * repeat_penalty::apply(const float * row, int32_t n, const std::vector<int32_t> & seq,
                                    const std::vector<int32_t> & drafted, int32_t n_block) {
    if (!on()) {
        return row;
    }
    const size_t total = seq.size() + (size_t) n_block;
    const size_t first = last_n > 0 && total > (size_t) last_n ? total - (size_t) last_n : 0;
    history.clear();
    for (size_t i = first; i < total; ++i) {
        history.push_back(i < seq.size() ? seq[i] : drafted[i - seq.size()]);
    }
    apply_repeat_penalty(row, n, history, penalty, out);
    return out.data();
}

void token_logprobs(const float * row, int32_t n, int32_t tok, int32_t n_top, std::vector<cospec_token_logprob> & out) {
    const float lse = (float) log_sum_exp(row, n);
    out.push_back({tok, row[tok] - lse});
    const int32_t k = std::min(n_top, n);
    std::vector<cospec_token_logprob> top;
    top.reserve((size_t) std::max(k, 0));
    const auto better = [](const cospec_token_logprob & a, const cospec_token_logprob & b) {
        return a.logprob > b.logprob || (a.logprob == b.logprob && a.token < b.token);
    };
    for (int32_t i = 0; i < n && k > 0; ++i) { // a heap whose front is the worst of the k best so far
        const cospec_token_logprob t {i, row[i]};
        if ((int32_t) top.size() < k) {
            top.push_back(t);
            std::push_heap(top.begin(), top.end(), better);
        } else if (better(t, top.front())) {
            std::pop_heap(top.begin(), top.end(), better);
            top.back() = t;
            std::push_heap(top.begin(), top.end(), better);
        }
    }
    std::sort_heap(top.begin(), top.end(), better);
    for (const auto & t : top) {
        out.push_back({t.token, t.logprob - lse});
    }
    for (int32_t i = (int32_t) top.size(); i < n_top; ++i) {
        out.push_back({-1, -INFINITY});
    }
}

int32_t argmax(const float * logits, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; ++i) {
        if (logits[i] > logits[best]) {
            best = i;
        }
    }
    return best;
}

static float max_of(const float * x, int32_t n) {
    return *std::max_element(x, x + n);
}

void sampling_probs(const float * logits, int32_t n, const sampler_config & cfg, std::vector<float> & probs) {
    probs.assign(n, 0.0f);
    const float inv_t = 1.0f / (cfg.temperature > 0.0f ? cfg.temperature : 1.0f);
    const bool use_k = cfg.top_k > 0 && cfg.top_k < n;
    const bool use_p = cfg.top_p < 1.0f;
    const bool use_min_p = cfg.min_p > 0.0f;

    if (!use_k && !use_p && !use_min_p) {
        // Plain temperature: one pass over the vocabulary, no sorting.
        const float m = max_of(logits, n);
        double sum = 0.0;
        for (int32_t i = 0; i < n; ++i) {
            probs[i] = std::exp((logits[i] - m) * inv_t);
            sum += probs[i];
        }
        const float inv = (float) (1.0 / sum);
        for (int32_t i = 0; i < n; ++i) {
            probs[i] *= inv;
        }
        return;
    }

    // llama.cpp's order: top-k, top-p, min-p on the model's own distribution
    // (temperature 1), then the temperature over the tokens left.
    std::vector<int32_t> idx(n);
    std::iota(idx.begin(), idx.end(), 0);
    auto by_logit = [logits](int32_t a, int32_t b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    };
    if (use_k) {
        std::nth_element(idx.begin(), idx.begin() + cfg.top_k, idx.end(), by_logit);
        idx.resize(cfg.top_k);
    }
    std::sort(idx.begin(), idx.end(), by_logit);

    const float m = logits[idx[0]];
    std::vector<double> p(idx.size());
    double sum = 0.0;
    for (size_t j = 0; j < idx.size(); ++j) {
        p[j] = std::exp((double) (logits[idx[j]] - m));
        sum += p[j];
    }
    size_t keep = idx.size();
    if (use_p) {
        // Smallest prefix of the sorted candidates whose mass reaches top_p.
        double cum = 0.0;
        for (size_t j = 0; j < idx.size(); ++j) {
            cum += p[j] / sum;
            if (cum >= cfg.top_p) {
                keep = j + 1;
                break;
            }
        }
    }
    if (use_min_p) {
        // p_j / p_max = p[j] / p[0] (sorted, unnormalised): keep those >= min_p.
        size_t j = 1;
        while (j < keep && p[j] >= cfg.min_p * p[0]) {
            ++j;
        }
        keep = j;
    }
    double kept_sum = 0.0;
    for (size_t j = 0; j < keep; ++j) {
        p[j] = std::exp((double) (logits[idx[j]] - m) * inv_t);
        kept_sum += p[j];
    }
    for (size_t j = 0; j < keep; ++j) {
        probs[idx[j]] = (float) (p[j] / kept_sum);
    }
}

void apply_repeat_penalty(const float * logits, int32_t n, std::vector<int32_t> & history, float penalty,
                          std::vector<float> & out) {
    out.assign(logits, logits + n);
    // Once per distinct token, as llama.cpp does: a repeated token is not penalised twice.
    std::sort(history.begin(), history.end());
    history.erase(std::unique(history.begin(), history.end()), history.end());
    for (const int32_t t : history) {
        if (t >= 0 && t < n) {
            out[t] = out[t] > 0.0f ? out[t] / penalty : out[t] * penalty;
        }
    }
}

double uniform01(std::mt19937_64 & rng) {
    // 53 random bits -> [0, 1), identical on every platform (unlike std::uniform_real_distribution).
    return (double) (rng() >> 11) * (1.0 / 9007199254740992.0);
}

int32_t sample_from(const std::vector<float> & probs, std::mt19937_64 & rng) {
    double total = 0.0;
    for (float p : probs) {
        total += p;
    }
    const double r = uniform01(rng) * total;
    double cum = 0.0;
    int32_t last_nonzero = 0;
    for (size_t i = 0; i < probs.size(); ++i) {
        if (probs[i] > 0.0f) {
            cum += probs[i];
            last_nonzero = (int32_t) i;
            if (r < cum) {
                return (int32_t) i;
            }
        }
    }
    return last_nonzero; // rounding left r just above the last bucket
}

float top_probability(const float * logits, int32_t n) {
    const float m = max_of(logits, n);
    double sum = 0.0;
    for (int32_t i = 0; i < n; ++i) {
        sum += std::exp(logits[i] - m);
    }
    return (float) (1.0 / sum);
}

float entropy(const float * logits, int32_t n, float temperature) {
    const float inv_t = 1.0f / (temperature > 0.0f ? temperature : 1.0f);
    const float m = max_of(logits, n);
    // H = log Z - sum p_i * z_i, with z_i = (l_i - m) / T and Z = sum exp(z_i).
    double z_sum = 0.0;
    double zp_sum = 0.0;
    for (int32_t i = 0; i < n; ++i) {
        const double z = (logits[i] - m) * inv_t;
        const double e = std::exp(z);
        z_sum += e;
        zp_sum += e * z;
    }
    return (float) (std::log(z_sum) - zp_sum / z_sum);
}

double log_sum_exp(const float * logits, int32_t n) {
    const float m = max_of(logits, n);
    double z_sum = 0.0;
    for (int32_t i = 0; i < n; ++i) {
        z_sum += std::exp((double) (logits[i] - m));
    }
    return m + std::log(z_sum);
}

float top_k_entropy(const float * logits, int32_t n, int32_t k) {
    if (k <= 0 || k >= n) {
        return entropy(logits, n, 1.0f);
    }
    const double lse = log_sum_exp(logits, n);
    // The k largest logits, kept sorted in a tiny array (k is a handful).
    std::vector<float> top;
    top.reserve((size_t) k + 1);
    for (int32_t i = 0; i < n; ++i) {
        if ((int32_t) top.size() < k || logits[i] > top.back()) {
            top.insert(std::upper_bound(top.begin(), top.end(), logits[i], std::greater<float>()), logits[i]);
            if ((int32_t) top.size() > k) {
                top.pop_back();
            }
        }
    }
    double h = 0.0;
    for (float l : top) {
        const double logp = l - lse;
        h -= std::exp(logp) * logp;
    }
    return (float) h;
}

} // namespace cospec
