// Choosing tokens from logits: greedy, temperature / top-k / top-p / min-p
// sampling, the repeat penalty,
// and the acceptance test of lossless speculative sampling.
#pragma once

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
