// Choosing tokens from logits: greedy, temperature / top-k / top-p / min-p
// sampling, the repeat penalty,
// and the acceptance test of lossless speculative sampling.
#pragma once

#include "cospec.h"

#include <cstdint>
#include <random>
#include <vector>

namespace cospec {

// Temperatures below this decode greedily.
constexpr float MIN_SAMPLING_TEMPERATURE = 1e-4f;

struct sampler_config {
    float   temperature = 0.0f; // <= 0: greedy
    int32_t top_k       = 0;    // 0: off
    float   top_p       = 1.0f; // >= 1: off
    float   min_p       = 0.0f; // <= 0: off
};

// Index of the largest logit (the first one on ties).
int32_t argmax(const float * logits, int32_t n);

// Fill probs[0..n) with the distribution the sampler draws from: as llama.cpp,
// top-k, then top-p, then min-p select tokens by the model's own probabilities
// (temperature 1), and the temperature then shapes softmax over those (zero elsewhere).
void sampling_probs(const float * logits, int32_t n, const sampler_config & cfg, std::vector<float> & probs);

// Copy logits[0..n) into out with llama.cpp's repeat penalty applied to every
// distinct token of history (ids outside [0, n) are ignored). history is a
// scratch list: it is sorted and deduplicated in place.
void apply_repeat_penalty(const float * logits, int32_t n, std::vector<int32_t> & history, float penalty,
                          std::vector<float> & out);

// llama.cpp's repeat penalty over the last `last_n` tokens of a history: the sequence so far and,
// at a block's position j, its first j drafted tokens (the draft and the target of one position
// see the same history, which keeps speculative sampling lossless).
class repeat_penalty {
  public:
    repeat_penalty(float penalty, int32_t last_n) : penalty(penalty), last_n(last_n) {}
    bool on() const { return penalty != 1.0f && last_n != 0; }
    // The row penalised for seq and drafted[0..n_block) (last_n < 0: all of them), or the row itself when off.
    const float * apply(const float * row, int32_t n, const std::vector<int32_t> & seq, const std::vector<int32_t> & drafted,
                        int32_t n_block);

  private:
    float penalty;
    int32_t last_n;
    std::vector<int32_t> history;
    std::vector<float> out;
};

// Append to out tok's log-probability in row (n logits: log softmax at temperature 1), then the
// n_top likeliest tokens there, likeliest first (equal ones by id); {-1, -inf} pads a vocabulary
// smaller than n_top, so that every token has 1 + n_top entries.
void token_logprobs(const float * row, int32_t n, int32_t tok, int32_t n_top, std::vector<cospec_token_logprob> & out);

// Draw one index from a probability vector (sums to 1 up to rounding).
int32_t sample_from(const std::vector<float> & probs, std::mt19937_64 & rng);

// Uniform number in [0, 1).
double uniform01(std::mt19937_64 & rng);

// Largest softmax probability of logits at temperature 1 (for draft_p_min).
float top_probability(const float * logits, int32_t n);

// Shannon entropy in nats of softmax(logits / temperature).
float entropy(const float * logits, int32_t n, float temperature);

// log(sum(exp(logits))), computed stably.
double log_sum_exp(const float * logits, int32_t n);

// FLy's entropy: -sum p log p over the k most likely tokens only, with p the
// full softmax at temperature 1 (not renormalised); k <= 0 gives the full entropy.
float top_k_entropy(const float * logits, int32_t n, int32_t k);

} // namespace cospec
