// The learned arbiter's file, arbiter.gguf: its metadata, head and domain gate, read once and
// checked before use (the file is untrusted), so nothing downstream parses text.
#pragma once

#include "cospec.h"
#include "ggml.h"
#include "gguf.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace cospec {

struct gguf_deleter {
    void operator()(gguf_context * g) const { gguf_free(g); }
};
struct ggml_deleter {
    void operator()(ggml_context * c) const { ggml_free(c); }
};

// The head: standardise the input, then Linear (ReLU Linear)* and a sigmoid.
// Weights are row-major [n_out][n_in], as torch's nn.Linear stores them.
struct head_mlp {
    struct layer {
        int32_t n_in = 0;
        int32_t n_out = 0;
        std::vector<float> weight;
        std::vector<float> bias;
    };
    std::vector<float> in_mean;
    std::vector<float> in_scale;
    std::vector<layer> layers;

    int32_t n_in() const { return (int32_t) in_mean.size(); }

    float operator()(const float * x, std::vector<float> & a, std::vector<float> & b) const {
        a.resize(in_mean.size());
        for (size_t k = 0; k < a.size(); ++k) {
            a[k] = (x[k] - in_mean[k]) * in_scale[k];
        }
        for (size_t l = 0; l < layers.size(); ++l) {
            const layer & L = layers[l];
            b.resize((size_t) L.n_out);
            for (int32_t o = 0; o < L.n_out; ++o) {
                const float * w = L.weight.data() + (size_t) o * L.n_in;
                float acc = 0.0f;
                for (int32_t i = 0; i < L.n_in; ++i) {
                    acc += w[i] * a[i];
                }
                acc += L.bias[o];
                b[o] = l + 1 < layers.size() ? std::max(acc, 0.0f) : acc;
            }
            std::swap(a, b);
        }
        return 1.0f / (1.0f + std::exp(-a[0]));
    }
};

// What arbiter.gguf holds.
// An arbiter file, read once: every value checked and typed here, so nothing downstream parses text.
struct bundle {
    std::string path;  // arbiter.gguf
    std::string dir;
    std::map<std::string, std::string> meta; // every scalar value under cospec.arbiter., as text (cospec_arbiter_meta)
    int32_t kind = COSPEC_ARBITER_FEATURES;  // enum cospec_arbiter_kind: a learned one
    float threshold = 0.5f;
    std::string name;              // empty: "cospec-" and the kind
    std::string draft_fingerprint; // of the draft it was made for
    std::string draft_file;        // that draft's file name, for messages (may be empty)
    // What its states were drafted under (absent in files that do not say): the timing-free
    // block lengths use verify_cost; the Python side warns on another draft_max.
    std::optional<double> verify_cost;
    std::optional<double> draft_cost;
    std::optional<int32_t> draft_max;
    std::optional<bool> adaptive_draft;
    // A LoRA arbiter: its adapter (a file beside arbiter.gguf), the draft's width, the scale.
    std::string adapter;
    int32_t n_embd = 0;
    float lora_scale = 1.0f;
    bool context_from_draft = false; // lora_context == "draft"
    int32_t n_head_layers = 0;
    // The block features it reads: the first n_features of cospec_block_features (files from
    // before the key read the first 16, all there was).
    int32_t n_features = 16;
    head_mlp head;
    // The domain gate: sorted keys first * gate_n_vocab + second of the training prompts' bigrams.
    std::vector<uint64_t> gate_keys;
    int64_t gate_n_vocab = 0;
    float gate_threshold = 0.0f;
    // Or a classifier gate: logistic regression over the prompt's hashed unigrams and bigrams.
    std::vector<float> gate_weights;
    float gate_bias = 0.0f;
    int32_t gate_hash_bits = 0;

    // Or an embedding gate: logistic regression over the draft's hidden state at the prompt's last token.
    std::vector<float> gate_embedding;

    bool has_gate() const { return !gate_keys.empty() || !gate_weights.empty() || !gate_embedding.empty(); }
};

// The kind arbiter.gguf names (as cospec_arbiter_kind_name spells it), if it is a learned one.
std::optional<int32_t> learned_kind(const std::string & name);

// The share of the prompt's adjacent token pairs among the gate's (1 for a prompt of one token).
double gate_coverage(const bundle & b, const cospec_token * prompt, int32_t n_prompt);
// A classifier gate's P(the prompt is one of the arbiter's tasks) (1 for an empty prompt).
double gate_probability(const bundle & b, const cospec_token * prompt, int32_t n_prompt);
// What the gate compares with its threshold: the coverage or the classifier's probability.
double gate_score(const bundle & b, const cospec_token * prompt, int32_t n_prompt);

// Read and check arbiter.gguf at path (the folder's adapter beside it).
int32_t read_bundle(const char * path, bundle & b);

std::string parent_dir(const std::string & path);
bool is_dir(const std::string & path);

} // namespace cospec
