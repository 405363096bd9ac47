// Learned arbiters: a small MLP head that maps each mismatch position of a
// block to P(keep draft token).
//   features  the head reads the block's features (cospec_block_features)
//   lora      the draft model with a LoRA adapter reads the block's region
//             after its context, and the head reads
//             [hidden(d_i), hidden(t_i), features_i]. Where the adapter applies
//             is the arbiter's lora_context:
//               draft    the region only: the context's keys and values are the
//                        draft's own, copied from the cache it generated into,
//                        so a verdict costs one decode of the region
//               adapter  the context too (the first arbiters, and what an
//                        arbiter without the key means): the arbiter's context
//                        decodes the whole text a second time
// The adapter is folded into a private F32 copy of the draft's weights where
// they are small (fold_adapter): on a small draft the adapter's two extra
// products per projection cost more than the projection itself.
// An arbiter is a folder: arbiter.gguf (the head's weights and the metadata
// binding it to its draft), adapter.gguf for `lora` (llama.cpp's LoRA format),
// and head.onnx (the same head for ONNX Runtime).
#include "engine.h"

#include "ggml.h"
#include "gguf.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <sys/stat.h>
#include <vector>

using cospec::fail;

namespace {

constexpr const char * KEY_PREFIX = "cospec.arbiter.";
constexpr uint32_t FORMAT_VERSION = COSPEC_ARBITER_FORMAT_VERSION;
// The domain gate's bigrams (cospec_local/arbiter/domain_gate.py): a tensor (n, 2) of token ids.
constexpr const char * GATE_TENSOR = "gate.bigrams";
constexpr int64_t MAX_GATE_BIGRAMS = 1 << 24; // 128 MiB of keys: far past any training set's prompts
// A classifier gate's weights over hashed token unigrams and bigrams: a tensor (2^bits) of F32.
constexpr const char * CLASSIFIER_GATE_TENSOR = "gate.weights";
constexpr int32_t MAX_GATE_HASH_BITS = 24;
// domain_gate.hashed_features: a unigram t hashes (t + 1) * A, a bigram (s, t) (s + 1) * A + (t + 1) * B.
constexpr uint64_t GATE_HASH_FIRST = 0x9E3779B97F4A7C15ull;
constexpr uint64_t GATE_HASH_SECOND = 0xC2B2AE3D27D4EB4Full;
// The region holds a draft and a target token per block position.
constexpr int32_t MAX_REGION = 2 * cospec::MAX_BLOCK_BATCH;
// Bounds on a head read from an untrusted file.
constexpr int64_t MAX_HEAD_WIDTH = 1 << 16;
constexpr uint32_t MAX_HEAD_LAYERS = 8;
constexpr size_t MAX_HEAD_BYTES = 256u << 20;
// Folding the adapter: the folded weights as F32 at most, and the draft file read for it at most.
constexpr size_t MAX_FOLDED_BYTES = 64u << 20;
constexpr size_t MAX_FOLD_SOURCE_BYTES = 512u << 20;
// Architectures whose blocks multiply these weights through llama.cpp's
// build_lora_mm (W x + s B A x), so a folded W + s B A computes the same.
const std::set<std::string> FOLDABLE_ARCHITECTURES = {"llama", "gemma3", "qwen2", "qwen3"};
const std::set<std::string> FOLDABLE_WEIGHTS = {"attn_q", "attn_k", "attn_v", "attn_output",
                                                "ffn_gate", "ffn_up", "ffn_down"};

// "blk.<layer>.<weight>.weight" with <weight> one of FOLDABLE_WEIGHTS.
bool is_foldable_weight(const std::string & name) {
    constexpr std::string_view prefix = "blk.", suffix = ".weight";
    if (name.size() <= prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
        return false;
    }
    const size_t dot = name.find('.', prefix.size());
    if (dot == std::string::npos || dot == prefix.size() ||
        name.find_first_not_of("0123456789", prefix.size()) != dot) {
        return false;
    }
    return FOLDABLE_WEIGHTS.count(name.substr(dot + 1, name.size() - suffix.size() - dot - 1)) > 0;
}

std::string parent_dir(const std::string & path) {
    const size_t slash = path.find_last_of('/');
    return slash == std::string::npos ? "." : path.substr(0, slash);
}

bool is_dir(const std::string & path) {
    struct stat st {};
    return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

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

// The kind arbiter.gguf names (as cospec_arbiter_kind_name spells it), if it is a learned one.
std::optional<int32_t> learned_kind(const std::string & name) {
    for (const int32_t kind : {COSPEC_ARBITER_FEATURES, COSPEC_ARBITER_LORA}) {
        if (name == cospec_arbiter_kind_name(kind)) {
            return kind;
        }
    }
    return std::nullopt;
}

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
    head_mlp head;
    // The domain gate: sorted keys first * gate_n_vocab + second of the training prompts' bigrams.
    std::vector<uint64_t> gate_keys;
    int64_t gate_n_vocab = 0;
    float gate_threshold = 0.0f;
    // Or a classifier gate: logistic regression over the prompt's hashed unigrams and bigrams.
    std::vector<float> gate_weights;
    float gate_bias = 0.0f;
    int32_t gate_hash_bits = 0;

    bool has_gate() const { return !gate_keys.empty() || !gate_weights.empty(); }
};

// The share of the prompt's adjacent token pairs among the gate's (1 for a prompt of one token).
double gate_coverage(const bundle & b, const cospec_token * prompt, int32_t n_prompt) {
    if (n_prompt < 2) {
        return 1.0;
    }
    int32_t found = 0;
    for (int32_t i = 0; i + 1 < n_prompt; ++i) {
        const int64_t first = prompt[i], second = prompt[i + 1];
        if (first >= 0 && second >= 0 && first < b.gate_n_vocab && second < b.gate_n_vocab) {
            const uint64_t key = (uint64_t) first * (uint64_t) b.gate_n_vocab + (uint64_t) second;
            found += std::binary_search(b.gate_keys.begin(), b.gate_keys.end(), key);
        }
    }
    return (double) found / (double) (n_prompt - 1);
}

// A classifier gate's P(the prompt is one of the arbiter's tasks) (1 for an empty prompt): the
// weights of the prompt's distinct buckets, summed in increasing bucket order as domain_gate.py does.
double gate_probability(const bundle & b, const cospec_token * prompt, int32_t n_prompt) {
    if (n_prompt < 1) {
        return 1.0;
    }
    const int shift = 64 - b.gate_hash_bits;
    std::vector<uint64_t> buckets;
    buckets.reserve(2 * (size_t) n_prompt);
    for (int32_t i = 0; i < n_prompt; ++i) {
        const uint64_t first = (uint64_t) (int64_t) prompt[i] + 1;  // as numpy's int64 -> uint64
        buckets.push_back((first * GATE_HASH_FIRST) >> shift);
        if (i + 1 < n_prompt) {
            const uint64_t second = (uint64_t) (int64_t) prompt[i + 1] + 1;
            buckets.push_back((first * GATE_HASH_FIRST + second * GATE_HASH_SECOND) >> shift);
        }
    }
    std::sort(buckets.begin(), buckets.end());
    buckets.erase(std::unique(buckets.begin(), buckets.end()), buckets.end());
    double z = (double) b.gate_bias;
    for (const uint64_t k : buckets) {
        z += (double) b.gate_weights[(size_t) k];
    }
    return z > -700.0 ? 1.0 / (1.0 + std::exp(-z)) : 0.0;
}

// What the gate compares with its threshold: the coverage or the classifier's probability.
double gate_score(const bundle & b, const cospec_token * prompt, int32_t n_prompt) {
    return b.gate_keys.empty() ? gate_probability(b, prompt, n_prompt) : gate_coverage(b, prompt, n_prompt);
}

// gate.weights, gate_bias and gate_hash_bits, checked before use: 2^bits finite weights.
int32_t read_classifier_gate(const ggml_tensor * t, const std::string & who, bundle & b) {
    const auto bias = b.meta.find("gate_bias");
    const auto bits = b.meta.find("gate_hash_bits");
    if (bias == b.meta.end() || bits == b.meta.end()) {
        return fail(COSPEC_ERR_ARBITER, who + ": tensor '" + CLASSIFIER_GATE_TENSOR + "' without gate_bias and gate_hash_bits");
    }
    char * end = nullptr;
    const long n_bits = std::strtol(bits->second.c_str(), &end, 10);
    if (*end != '\0' || n_bits < 1 || n_bits > MAX_GATE_HASH_BITS) {
        return fail(COSPEC_ERR_ARBITER, who + ": gate_hash_bits must lie in [1, " + std::to_string(MAX_GATE_HASH_BITS) + "]");
    }
    b.gate_hash_bits = (int32_t) n_bits;
    b.gate_bias = std::strtof(bias->second.c_str(), &end);
    if (end == bias->second.c_str() || *end != '\0' || !std::isfinite(b.gate_bias)) {
        return fail(COSPEC_ERR_ARBITER, who + ": gate_bias must be a finite number");
    }
    if (t->type != GGML_TYPE_F32 || t->ne[0] != ((int64_t) 1 << n_bits) || t->ne[1] != 1 || t->ne[2] != 1 || t->ne[3] != 1) {
        return fail(COSPEC_ERR_ARBITER, who + ": tensor '" + CLASSIFIER_GATE_TENSOR + "' must hold 2^gate_hash_bits F32 weights");
    }
    const float * w = (const float *) t->data;
    b.gate_weights.assign(w, w + t->ne[0]);
    if (!std::all_of(b.gate_weights.begin(), b.gate_weights.end(), [](float x) { return std::isfinite(x) && std::fabs(x) < 1e6f; })) {
        return fail(COSPEC_ERR_ARBITER, who + ": tensor '" + CLASSIFIER_GATE_TENSOR + "' holds a weight that is not a finite number");
    }
    return COSPEC_OK;
}

// gate.bigrams and its two keys, checked before use: ids inside the vocabulary, keys strictly
// increasing (what binary search needs), a threshold in [0, 1].
int32_t read_gate(ggml_context * ctx, const std::string & who, bundle & b) {
    const ggml_tensor * t = ggml_get_tensor(ctx, GATE_TENSOR);
    const ggml_tensor * weights = ggml_get_tensor(ctx, CLASSIFIER_GATE_TENSOR);
    const auto threshold = b.meta.find("gate_threshold");
    const auto n_vocab = b.meta.find("gate_n_vocab");
    if (t != nullptr && weights != nullptr) {
        return fail(COSPEC_ERR_ARBITER, who + ": two domain gates ('" + GATE_TENSOR + "' and '" + CLASSIFIER_GATE_TENSOR + "')");
    }
    const bool classifier_keys = b.meta.count("gate_bias") != 0 || b.meta.count("gate_hash_bits") != 0;
    if (t == nullptr && weights == nullptr) {
        if (threshold != b.meta.end() || n_vocab != b.meta.end() || classifier_keys) {
            return fail(COSPEC_ERR_ARBITER, who + ": gate keys without a gate tensor");
        }
        return COSPEC_OK;
    }
    if (t != nullptr && classifier_keys) {
        return fail(COSPEC_ERR_ARBITER, who + ": a classifier gate's keys beside the tensor '" + GATE_TENSOR + "'");
    }
    const char * tensor_name = t != nullptr ? GATE_TENSOR : CLASSIFIER_GATE_TENSOR;
    if (threshold == b.meta.end() || n_vocab == b.meta.end()) {
        return fail(COSPEC_ERR_ARBITER, who + ": tensor '" + tensor_name + "' without gate_threshold and gate_n_vocab");
    }
    char * end = nullptr;
    b.gate_threshold = std::strtof(threshold->second.c_str(), &end);
    if (end == threshold->second.c_str() || *end != '\0' || !(b.gate_threshold >= 0.0f && b.gate_threshold <= 1.0f)) {
        return fail(COSPEC_ERR_ARBITER, who + ": gate_threshold must lie in [0, 1]");
    }
    b.gate_n_vocab = std::strtoll(n_vocab->second.c_str(), &end, 10);
    if (*end != '\0' || b.gate_n_vocab < 1 || b.gate_n_vocab > INT32_MAX) {
        return fail(COSPEC_ERR_ARBITER, who + ": gate_n_vocab out of range");
    }
    if (weights != nullptr) {
        return read_classifier_gate(weights, who, b);
    }
    if (t->type != GGML_TYPE_I32 || t->ne[0] != 2 || t->ne[1] < 1 || t->ne[1] > MAX_GATE_BIGRAMS || t->ne[2] != 1 ||
        t->ne[3] != 1) {
        return fail(COSPEC_ERR_ARBITER, who + ": tensor '" + GATE_TENSOR + "' must be I32 pairs (n, 2), n in [1, " +
                                            std::to_string(MAX_GATE_BIGRAMS) + "]");
    }
    const int32_t * ids = (const int32_t *) t->data;
    b.gate_keys.resize((size_t) t->ne[1]);
    for (int64_t i = 0; i < t->ne[1]; ++i) {
        const int64_t first = ids[2 * i], second = ids[2 * i + 1];
        if (first < 0 || second < 0 || first >= b.gate_n_vocab || second >= b.gate_n_vocab) {
            return fail(COSPEC_ERR_ARBITER, who + ": gate bigram " + std::to_string(i) + " is outside the vocabulary");
        }
        b.gate_keys[(size_t) i] = (uint64_t) first * (uint64_t) b.gate_n_vocab + (uint64_t) second;
        if (i > 0 && b.gate_keys[(size_t) i] <= b.gate_keys[(size_t) i - 1]) {
            return fail(COSPEC_ERR_ARBITER, who + ": gate bigrams are not sorted and unique");
        }
    }
    return COSPEC_OK;
}

struct gguf_deleter {
    void operator()(gguf_context * g) const { gguf_free(g); }
};
struct ggml_deleter {
    void operator()(ggml_context * c) const { ggml_free(c); }
};

// Scalar metadata as text; typed getters of gguf assert on a wrong type, so
// every value is read through its actual type.
bool scalar_text(const gguf_context * g, int64_t id, std::string & out) {
    switch (gguf_get_kv_type(g, id)) {
        case GGUF_TYPE_STRING:  out = gguf_get_val_str(g, id); return true;
        case GGUF_TYPE_UINT32:  out = std::to_string(gguf_get_val_u32(g, id)); return true;
        case GGUF_TYPE_INT32:   out = std::to_string(gguf_get_val_i32(g, id)); return true;
        case GGUF_TYPE_UINT64:  out = std::to_string(gguf_get_val_u64(g, id)); return true;
        case GGUF_TYPE_INT64:   out = std::to_string(gguf_get_val_i64(g, id)); return true;
        case GGUF_TYPE_FLOAT32: {
            char buf[32];
            std::snprintf(buf, sizeof(buf), "%.9g", gguf_get_val_f32(g, id));
            out = buf;
            return true;
        }
        case GGUF_TYPE_BOOL:    out = gguf_get_val_bool(g, id) ? "true" : "false"; return true;
        default:                return false;
    }
}

int32_t read_tensor(ggml_context * ctx, const std::string & who, const std::string & name, int64_t ne0, int64_t ne1,
                    std::vector<float> & out) {
    const ggml_tensor * t = ggml_get_tensor(ctx, name.c_str());
    if (t == nullptr) {
        return fail(COSPEC_ERR_ARBITER, who + ": tensor '" + name + "' is missing");
    }
    if (t->type != GGML_TYPE_F32 || t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != 1 || t->ne[3] != 1) {
        return fail(COSPEC_ERR_ARBITER, who + ": tensor '" + name + "' must be F32 of shape [" + std::to_string(ne0) + ", " +
                                            std::to_string(ne1) + "], got type " + ggml_type_name(t->type) + " [" +
                                            std::to_string(t->ne[0]) + ", " + std::to_string(t->ne[1]) + "]");
    }
    const float * data = (const float *) t->data;
    out.assign(data, data + ne0 * ne1);
    for (float v : out) {
        if (!std::isfinite(v)) {
            return fail(COSPEC_ERR_ARBITER, who + ": tensor '" + name + "' holds a non-finite value");
        }
    }
    return COSPEC_OK;
}

// A number under key: absent (nullopt, true), or in [lo, hi] and whole where asked (true); false
// where the text is not such a number.
bool meta_number(const bundle & b, const char * key, double lo, double hi, bool whole, std::optional<double> & out) {
    const auto it = b.meta.find(key);
    out.reset();
    if (it == b.meta.end()) {
        return true;
    }
    char * end = nullptr;
    const double v = std::strtod(it->second.c_str(), &end);
    if (end == it->second.c_str() || *end != '\0' || !(v >= lo && v <= hi) || (whole && v != std::floor(v))) {
        return false;
    }
    out = v;
    return true;
}

// The file's cospec.arbiter.* values: every one as text (b.meta), the ones the engine uses typed and checked.
int32_t read_metadata(const gguf_context * g, const std::string & who, bundle & b) {
    const std::string prefix = KEY_PREFIX;
    for (int64_t i = 0; i < gguf_get_n_kv(g); ++i) {
        const std::string key = gguf_get_key(g, i);
        std::string value;
        if (key.compare(0, prefix.size(), prefix) == 0 && scalar_text(g, i, value)) {
            b.meta[key.substr(prefix.size())] = value;
        }
    }
    for (const char * key : {"version", "kind", "head_layers", "draft_fingerprint", "threshold"}) {
        if (b.meta.count(key) == 0) {
            return fail(COSPEC_ERR_ARBITER, who + ": not an arbiter file (no " + prefix + key + ")");
        }
    }
    if (b.meta["version"] != std::to_string(FORMAT_VERSION)) {
        return fail(COSPEC_ERR_ARBITER, who + ": format version " + b.meta["version"] + ", this engine reads version " +
                                            std::to_string(FORMAT_VERSION) +
                                            "; train the arbiter again with this version (cospec-local arbiter train)");
    }
    if (const std::optional<int32_t> learned = learned_kind(b.meta["kind"])) {
        b.kind = *learned;
    } else {
        return fail(COSPEC_ERR_ARBITER, who + ": unknown kind '" + b.meta["kind"] + "' (expected features or lora)");
    }
    b.draft_fingerprint = b.meta["draft_fingerprint"];
    b.draft_file = b.meta.count("draft_file") ? b.meta["draft_file"] : "";
    b.name = b.meta.count("name") ? b.meta["name"] : "";
    std::optional<double> v;
    if (!meta_number(b, "threshold", 0.0, 1.0, false, v)) {
        return fail(COSPEC_ERR_ARBITER, who + ": threshold must lie in [0, 1]");
    }
    b.threshold = (float) *v;
    if (!meta_number(b, "verify_cost", 0.0, 100.0, false, b.verify_cost)) {
        return fail(COSPEC_ERR_ARBITER, who + ": verify_cost must lie in [0, 100] target steps");
    }
    if (!meta_number(b, "draft_cost", 0.0, 100.0, false, b.draft_cost)) {
        return fail(COSPEC_ERR_ARBITER, who + ": draft_cost must lie in [0, 100] target steps");
    }
    if (!meta_number(b, "draft_max", 1.0, COSPEC_N_DRAFT_MAX, true, v)) {
        return fail(COSPEC_ERR_ARBITER, who + ": draft_max must be a whole number in [1, " +
                                            std::to_string(COSPEC_N_DRAFT_MAX) + "]");
    }
    if (v) {
        b.draft_max = (int32_t) *v;
    }
    if (const auto a = b.meta.find("adaptive_draft"); a != b.meta.end()) {
        if (a->second != "true" && a->second != "false") {
            return fail(COSPEC_ERR_ARBITER, who + ": adaptive_draft must be true or false");
        }
        b.adaptive_draft = a->second == "true";
    }
    if (!meta_number(b, "head_layers", 1.0, MAX_HEAD_LAYERS, true, v)) {
        return fail(COSPEC_ERR_ARBITER, who + ": head_layers must be 1.." + std::to_string(MAX_HEAD_LAYERS));
    }
    b.n_head_layers = (int32_t) *v;
    if (b.kind != COSPEC_ARBITER_LORA) {
        return COSPEC_OK;
    }
    for (const char * key : {"n_embd", "adapter"}) {
        if (b.meta.count(key) == 0) {
            return fail(COSPEC_ERR_ARBITER, who + ": not an arbiter file (no " + prefix + key + ")");
        }
    }
    b.adapter = b.meta["adapter"];
    if (!meta_number(b, "n_embd", 1.0, 1 << 20, true, v)) {
        return fail(COSPEC_ERR_ARBITER, who + ": n_embd must be a positive whole number");
    }
    b.n_embd = (int32_t) *v;
    if (!meta_number(b, "lora_scale", -1e6, 1e6, false, v)) {
        return fail(COSPEC_ERR_ARBITER, who + ": lora_scale must be a finite number");
    }
    b.lora_scale = v ? (float) *v : 1.0f;
    const auto context = b.meta.find("lora_context");
    if (context == b.meta.end()) {
        return fail(COSPEC_ERR_ARBITER, who + ": no lora_context (where the adapter applies: draft or adapter)");
    }
    const std::string & reader = context->second;
    if (reader != "draft" && reader != "adapter") {
        return fail(COSPEC_ERR_ARBITER, who + ": unknown lora_context '" + reader + "' (expected draft or adapter)");
    }
    b.context_from_draft = reader == "draft";
    return COSPEC_OK;
}

// The head: input normalisation and b.n_head_layers dense layers ending in one output.
int32_t read_head(ggml_context * ctx, const std::string & who, bundle & b) {
    const ggml_tensor * mean = ggml_get_tensor(ctx, "head.in_mean");
    if (mean == nullptr) {
        return fail(COSPEC_ERR_ARBITER, who + ": tensor 'head.in_mean' is missing");
    }
    const int64_t n_in = mean->ne[0];
    if (n_in < 1 || n_in > MAX_HEAD_WIDTH) {
        return fail(COSPEC_ERR_ARBITER, who + ": head input width " + std::to_string(n_in) + " is out of range");
    }
    if (read_tensor(ctx, who, "head.in_mean", n_in, 1, b.head.in_mean) != COSPEC_OK ||
        read_tensor(ctx, who, "head.in_scale", n_in, 1, b.head.in_scale) != COSPEC_OK) {
        return COSPEC_ERR_ARBITER;
    }
    int64_t width = n_in;
    for (int32_t l = 0; l < b.n_head_layers; ++l) {
        const std::string name = "head." + std::to_string(l) + ".weight";
        const ggml_tensor * w = ggml_get_tensor(ctx, name.c_str());
        const int64_t n_out = w ? w->ne[1] : 0;
        if (l + 1 == b.n_head_layers && n_out != 1) {
            return fail(COSPEC_ERR_ARBITER, who + ": the head's last layer must have one output");
        }
        if (n_out < 1 || n_out > MAX_HEAD_WIDTH) {
            return fail(COSPEC_ERR_ARBITER, who + ": tensor '" + name + "' is missing or has a bad shape");
        }
        head_mlp::layer L;
        L.n_in = (int32_t) width;
        L.n_out = (int32_t) n_out;
        if (read_tensor(ctx, who, name, width, n_out, L.weight) != COSPEC_OK ||
            read_tensor(ctx, who, "head." + std::to_string(l) + ".bias", n_out, 1, L.bias) != COSPEC_OK) {
            return COSPEC_ERR_ARBITER;
        }
        b.head.layers.push_back(std::move(L));
        width = n_out;
    }
    return COSPEC_OK;
}

int32_t read_bundle(const char * path, bundle & b) {
    b.path = path;
    if (is_dir(b.path)) {
        b.path += "/arbiter.gguf";
    }
    b.dir = parent_dir(b.path);
    const std::string who = "arbiter '" + b.path + "'";
    if (const int32_t st = cospec::check_gguf_file("arbiter", b.path.c_str()); st != COSPEC_OK) {
        return fail(COSPEC_ERR_ARBITER, cospec_last_error());
    }
    // Metadata first: a model file passed by mistake is refused before its data is read.
    gguf_init_params meta_only {};
    meta_only.no_alloc = true;
    std::unique_ptr<gguf_context, gguf_deleter> g(gguf_init_from_file(b.path.c_str(), meta_only));
    if (!g) {
        return fail(COSPEC_ERR_ARBITER, who + ": corrupt GGUF");
    }
    if (gguf_find_key(g.get(), (std::string(KEY_PREFIX) + "version").c_str()) < 0) {
        return fail(COSPEC_ERR_ARBITER, who + ": not an arbiter file (no " + KEY_PREFIX + "version)");
    }
    size_t data_size = 0;
    for (int64_t i = 0; i < gguf_get_n_tensors(g.get()); ++i) {
        data_size += gguf_get_tensor_size(g.get(), i);
    }
    if (data_size > MAX_HEAD_BYTES) {
        return fail(COSPEC_ERR_ARBITER, who + ": " + std::to_string(data_size >> 20) + " MiB of tensors, more than a head");
    }
    ggml_context * raw_ctx = nullptr;
    gguf_init_params gp {};
    gp.no_alloc = false; // the head is small: load its data now
    gp.ctx = &raw_ctx;
    g.reset(gguf_init_from_file(b.path.c_str(), gp));
    std::unique_ptr<ggml_context, ggml_deleter> ctx(raw_ctx);
    if (!g || !ctx) {
        return fail(COSPEC_ERR_ARBITER, who + ": corrupt GGUF");
    }
    if (const int32_t st = read_metadata(g.get(), who, b); st != COSPEC_OK) {
        return st;
    }
    if (const int32_t st = read_head(ctx.get(), who, b); st != COSPEC_OK) {
        return st;
    }
    return read_gate(ctx.get(), who, b);
}

// ------------------------------------------------------------ adapter folding

// What the folded copy of the draft is made from: the draft's tensors and, for
// each weight the adapter touches, its A, B and scale.
struct fold_plan {
    struct lora_pair {
        const ggml_tensor * a = nullptr; // [n_in, rank]
        const ggml_tensor * b = nullptr; // [rank, n_out]
    };
    std::unique_ptr<gguf_context, gguf_deleter> draft_gguf; // its tensor types of folded weights set to F32
    std::unique_ptr<gguf_context, gguf_deleter> adapter_gguf;
    std::unique_ptr<ggml_context, ggml_deleter> draft_data, adapter_data;
    std::map<std::string, lora_pair> pairs;
    float scale = 1.0f; // lora_scale * alpha / rank, as llama.cpp applies it
};

bool load_gguf_data(const std::string & path, std::unique_ptr<gguf_context, gguf_deleter> & g,
                    std::unique_ptr<ggml_context, ggml_deleter> & data) {
    ggml_context * raw = nullptr;
    gguf_init_params gp {};
    gp.no_alloc = false;
    gp.ctx = &raw;
    g.reset(gguf_init_from_file(path.c_str(), gp));
    data.reset(raw);
    return g && data;
}

// W + scale * B A, row by row (ggml layout: row o of W holds its n_in inputs).
void fold_weight(const fold_plan & plan, const fold_plan::lora_pair & pair, const ggml_tensor * w, std::vector<float> & out) {
    const int64_t n_in = w->ne[0];
    const int64_t n_out = w->ne[1];
    const int64_t rank = pair.a->ne[1];
    out.resize((size_t) (n_in * n_out));
    if (w->type == GGML_TYPE_F32) {
        std::copy_n((const float *) w->data, out.size(), out.begin());
    } else {
        ggml_get_type_traits(w->type)->to_float(w->data, out.data(), (int64_t) out.size());
    }
    const float * a = (const float *) pair.a->data; // a[k * n_in + i]
    const float * b = (const float *) pair.b->data; // b[o * rank + k]
    for (int64_t o = 0; o < n_out; ++o) {
        float * row = out.data() + o * n_in;
        for (int64_t k = 0; k < rank; ++k) {
            const float bk = plan.scale * b[o * rank + k];
            const float * ak = a + k * n_in;
            for (int64_t i = 0; i < n_in; ++i) {
                row[i] += bk * ak[i];
            }
        }
    }
}

// Write the folded draft as a GGUF into fp: the draft's metadata, its tensors
// as they are, the folded ones in F32. (llama_model_init_from_user would skip
// the file, but it creates every optional tensor of the architecture, biases
// and rope factors included, which this draft does not have.)
bool write_folded(const fold_plan & plan, FILE * fp) {
    const gguf_context * meta = plan.draft_gguf.get();
    if (!gguf_write_to_file_ptr(meta, fp, /*only_meta =*/ true)) {
        return false;
    }
    const long data_start = std::ftell(fp);
    const size_t alignment = gguf_get_alignment(meta);
    std::vector<float> folded;
    std::vector<char> zeros(alignment, 0);
    for (int64_t id = 0; id < gguf_get_n_tensors(meta); ++id) {
        const char * name = gguf_get_tensor_name(meta, id);
        const ggml_tensor * src = ggml_get_tensor(plan.draft_data.get(), name);
        if (src == nullptr) {
            return false;
        }
        const long at = data_start + (long) gguf_get_tensor_offset(meta, id);
        const long pad = at - std::ftell(fp);
        if (pad < 0 || (size_t) pad > alignment || std::fwrite(zeros.data(), 1, (size_t) pad, fp) != (size_t) pad) {
            return false;
        }
        const void * data = src->data;
        size_t size = ggml_nbytes(src);
        if (const auto pair = plan.pairs.find(name); pair != plan.pairs.end()) {
            fold_weight(plan, pair->second, src, folded);
            data = folded.data();
            size = folded.size() * sizeof(float);
        }
        if (size != gguf_get_tensor_size(meta, id) || std::fwrite(data, 1, size, fp) != size) {
            return false;
        }
    }
    const long end = std::ftell(fp) - data_start;
    const size_t tail = (alignment - (size_t) end % alignment) % alignment;
    return std::fwrite(zeros.data(), 1, tail, fp) == tail && std::fflush(fp) == 0;
}

// The folded draft, loaded like the draft (same devices); null where it cannot be made.
llama_model * load_folded(const fold_plan & plan, const cospec_engine & eng) {
    FILE * fp = std::tmpfile(); // unlinked already: nothing is left behind
    if (fp == nullptr) {
        return nullptr;
    }
    llama_model * model = nullptr;
    if (write_folded(plan, fp)) {
        std::rewind(fp);
        llama_model_params mp = llama_model_default_params();
        mp.n_gpu_layers = eng.draft_gpu_layers;
        mp.use_extra_bufts = eng.draft_extra_buffers;
        // locked in RAM where the draft is
        const bool locked = eng.draft_load_mode == LLAMA_LOAD_MODE_MLOCK || eng.draft_load_mode == LLAMA_LOAD_MODE_MMAP_MLOCK;
        mp.load_mode = locked ? LLAMA_LOAD_MODE_MLOCK : mp.load_mode;
        if (!eng.draft_devices.empty()) {
            mp.devices = const_cast<ggml_backend_dev_t *>(eng.draft_devices.data());
        }
        model = llama_model_load_from_file_ptr(fp, mp);
    }
    std::fclose(fp); // a mapping of it lives on with the model
    return model;
}

// Plan the fold of the adapter at adapter_path into the draft at draft_path.
// False (nothing folded, the adapter applies at decode instead) for what this
// fold does not cover: weights outside the blocks, quantized adapter tensors,
// types without a dequantizer, or more than MAX_FOLDED_BYTES of folded weights.
// Only where llama.cpp applies an adapter to a weight as W x + s B A x: the
// architectures and weights listed, and no per-tensor weight scale (it would
// multiply W x before the adapter's term is added, and the fold's delta too).
bool plan_fold(const cospec_engine & eng, const std::string & adapter_path, float lora_scale, fold_plan & plan) {
    const std::string & draft_path = eng.draft_path;
    struct stat st {};
    if (stat(draft_path.c_str(), &st) != 0 || (size_t) st.st_size > MAX_FOLD_SOURCE_BYTES) {
        return false;
    }
    if (!load_gguf_data(adapter_path, plan.adapter_gguf, plan.adapter_data)) {
        return false;
    }
    float alpha = 0.0f;
    if (const int64_t k = gguf_find_key(plan.adapter_gguf.get(), "adapter.lora.alpha");
        k >= 0 && gguf_get_kv_type(plan.adapter_gguf.get(), k) == GGUF_TYPE_FLOAT32) {
        alpha = gguf_get_val_f32(plan.adapter_gguf.get(), k);
    }
    // By the file's tensor list: the data context also holds the file's data as one blob tensor.
    for (int64_t id = 0; id < gguf_get_n_tensors(plan.adapter_gguf.get()); ++id) {
        const std::string name = gguf_get_tensor_name(plan.adapter_gguf.get(), id);
        const ggml_tensor * t = ggml_get_tensor(plan.adapter_data.get(), name.c_str());
        const size_t dot = name.rfind('.');
        const std::string base = dot == std::string::npos ? name : name.substr(0, dot);
        const std::string part = dot == std::string::npos ? "" : name.substr(dot + 1);
        if (t == nullptr || (part != "lora_a" && part != "lora_b") || !is_foldable_weight(base) ||
            t->type != GGML_TYPE_F32) {
            return false;
        }
        (part == "lora_a" ? plan.pairs[base].a : plan.pairs[base].b) = t;
    }
    if (plan.pairs.empty()) {
        return false;
    }
    // The draft is read again, once, and all that follows reads this copy: its fingerprint and
    // metadata (it must be the model the engine's arbiters were checked against, header and
    // all), the metadata checks and the header the fold writes.
    std::string fingerprint, header;
    if (!load_gguf_data(draft_path, plan.draft_gguf, plan.draft_data) ||
        !cospec::loaded_model_fingerprint(plan.draft_gguf.get(), plan.draft_data.get(), fingerprint, &header) ||
        fingerprint != eng.draft_fingerprint || header != eng.draft_header ||
        cospec::check_loaded_model_metadata("draft model '" + draft_path + "'", plan.draft_gguf.get(),
                                            plan.draft_data.get()) != COSPEC_OK) {
        return false;
    }
    const gguf_context * draft = plan.draft_gguf.get();
    if (const int64_t k = gguf_find_key(draft, "general.architecture");
        k < 0 || gguf_get_kv_type(draft, k) != GGUF_TYPE_STRING || !FOLDABLE_ARCHITECTURES.count(gguf_get_val_str(draft, k))) {
        return false;
    }
    size_t folded_bytes = 0;
    int64_t rank = -1;
    for (const auto & [base, pair] : plan.pairs) {
        const int64_t id = gguf_find_tensor(draft, base.c_str());
        const std::string weight_scale = base.substr(0, base.size() - std::strlen(".weight")) + ".scale";
        if (pair.a == nullptr || pair.b == nullptr || id < 0 || gguf_find_tensor(draft, weight_scale.c_str()) >= 0) {
            return false;
        }
        const ggml_type type = gguf_get_tensor_type(draft, id);
        if (type != GGML_TYPE_F32 && ggml_get_type_traits(type)->to_float == nullptr) {
            return false;
        }
        if (rank < 0) {
            rank = pair.b->ne[0];
        }
        if (pair.a->ne[1] != rank || pair.b->ne[0] != rank || ggml_n_dims(pair.a) > 2 || ggml_n_dims(pair.b) > 2) {
            return false;
        }
        if (pair.a->ne[0] < 1 || pair.b->ne[1] < 1 || pair.a->ne[0] > (int64_t) MAX_FOLDED_BYTES / pair.b->ne[1]) {
            return false;
        }
        const ggml_tensor * w = ggml_get_tensor(plan.draft_data.get(), base.c_str());
        if (w == nullptr || ggml_n_dims(w) != 2 || w->ne[0] != pair.a->ne[0] || w->ne[1] != pair.b->ne[1]) {
            return false;
        }
        folded_bytes += (size_t) (pair.a->ne[0] * pair.b->ne[1]) * sizeof(float);
    }
    if (rank < 1 || folded_bytes > MAX_FOLDED_BYTES) {
        return false;
    }
    plan.scale = alpha != 0.0f ? lora_scale * alpha / (float) rank : lora_scale;
    // Last, after the fingerprint: the header the fold writes gives the folded weights F32
    // (the data context's tensors keep their own types; only the file's tensor infos change).
    for (const auto & [base, pair] : plan.pairs) {
        gguf_set_tensor_type(plan.draft_gguf.get(), base.c_str(), GGML_TYPE_F32);
    }
    return true;
}

struct learned_arbiter final : cospec_arbiter {
    cospec_engine * eng = nullptr;
    bundle b;
    std::string label;
    float keep_threshold = 0.5f;
    cospec_head_fn head_fn = nullptr;
    void * head_user_data = nullptr;
    bool gate_on = false; // has a domain gate, and the load asked to use it

    // The LoRA arbiter's own context, on the draft model with the adapter
    // attached, or on `folded`, the draft with the adapter in its weights.
    llama_adapter_lora * adapter = nullptr;
    llama_model * folded = nullptr;
    llama_context * ctx = nullptr;
    llama_batch batch {};
    int32_t n_batch = 0;
    std::vector<llama_token> cached; // prefix tokens in its KV cache, positions 0..n-1

    std::vector<float> features, inputs, rows, hidden, probs, scratch_a, scratch_b;
    std::vector<uint8_t> draft_state; // the draft's cached sequence, on its way to this context

    ~learned_arbiter() override {
        if (ctx != nullptr) {
            llama_batch_free(batch);
            llama_free(ctx);
        }
        if (folded != nullptr) {
            llama_model_free(folded);
        }
        if (adapter != nullptr) {
            llama_adapter_lora_free(adapter);
        }
    }

    const char * name() const override { return label.c_str(); }
    int32_t kind() const override { return b.kind; }
    bool needs_draft_logits() const override { return true; }
    float threshold() const override { return keep_threshold; }
    const cospec_engine * engine() const override { return eng; }
    bool uses_engine_draft() const override { return b.context_from_draft; }
    bool admits(const cospec_token * prompt, int32_t n_prompt) const override {
        return !gate_on || gate_score(b, prompt, n_prompt) >= (double) b.gate_threshold;
    }
    std::optional<double> trained_verify_cost() const override { return b.verify_cost; }
    std::optional<double> trained_draft_cost() const override {
        return b.draft_cost && *b.draft_cost > 0.0 ? b.draft_cost : std::nullopt; // 0: the pair's ratio
    }
    const char * meta(const char * key) const override {
        if (b.kind == COSPEC_ARBITER_LORA && std::strcmp(key, "adapter_use") == 0) {
            return folded != nullptr ? "folded" : "decode";
        }
        auto it = b.meta.find(key);
        return it == b.meta.end() ? nullptr : it->second.c_str();
    }
    void reset() override {
        if (ctx != nullptr) {
            llama_memory_clear(llama_get_memory(ctx), true);
            cached.clear();
        }
    }

    int32_t cols() const { return b.head.n_in(); }

    int32_t open_lora(const cospec_learned_arbiter_params & p) {
        const std::string adapter_path = b.dir + "/" + b.adapter;
        if (const int32_t st = cospec::check_gguf_file("arbiter adapter", adapter_path.c_str()); st != COSPEC_OK) {
            return fail(COSPEC_ERR_ARBITER, cospec_last_error());
        }
        if (const int32_t st = cospec::check_adapter_metadata("arbiter adapter", adapter_path.c_str()); st != COSPEC_OK) {
            return fail(COSPEC_ERR_ARBITER, cospec_last_error());
        }
        // llama.cpp checks that the adapter fits the draft, folded or not.
        adapter = llama_adapter_lora_init(eng->draft.model, adapter_path.c_str());
        if (adapter == nullptr) {
            return fail(COSPEC_ERR_ADAPTER, "arbiter adapter '" + adapter_path + "' does not fit the draft model" +
                                                " (llama.cpp refused it; see its log with verbose on)");
        }
        if (p.fold_adapter) {
            fold_plan plan;
            if (plan_fold(*eng, adapter_path, b.lora_scale, plan)) {
                folded = load_folded(plan, *eng);
            }
            // A fold that did not happen leaves the adapter to apply at decode: not an error.
            cospec::take_llama_errors();
            cospec::clear_error();
            if (folded != nullptr) {
                llama_adapter_lora_free(adapter);
                adapter = nullptr;
            }
        }
        llama_context_params cp = llama_context_default_params();
        n_batch = std::max(eng->n_batch, MAX_REGION);
        cp.n_ctx = (uint32_t) (eng->n_ctx + MAX_REGION);
        cp.n_batch = (uint32_t) n_batch;
        cp.n_ubatch = (uint32_t) n_batch; // the region must be one micro-batch to attend both ways
        cp.n_seq_max = 1;
        cp.n_threads = p.n_threads > 0 ? p.n_threads : eng->n_threads;
        cp.n_threads_batch = p.n_threads > 0 ? p.n_threads : eng->n_threads;
        cp.no_perf = true;
        cp.swa_full = true;
        cp.embeddings = false;
        cp.pooling_type = LLAMA_POOLING_TYPE_NONE;
        if (b.context_from_draft) {
            // The cache receives the draft's: the same layout (its cache types, the same attention kernel).
            cp.type_k = eng->draft_cache_type_k;
            cp.type_v = eng->draft_cache_type_v;
            cp.flash_attn_type = eng->draft.flash_attn;
        } else {
            // F32 cache and plain attention: the hidden states must match the torch model the head was trained on.
            cp.type_k = GGML_TYPE_F32;
            cp.type_v = GGML_TYPE_F32;
            cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
        }
        cp.abort_callback = [](void * data) { return static_cast<std::atomic<bool> *>(data)->load(); };
        cp.abort_callback_data = &eng->abort_flag;
        ctx = llama_init_from_model(folded != nullptr ? folded : eng->draft.model, cp);
        if (ctx == nullptr) {
            return fail(COSPEC_ERR_ARBITER, "could not create the arbiter's draft context");
        }
        batch = llama_batch_init(n_batch, 0, 1);
        float scale = b.lora_scale;
        if (adapter != nullptr && llama_set_adapters_lora(ctx, &adapter, 1, &scale) != 0) {
            return fail(COSPEC_ERR_ADAPTER, "llama.cpp could not attach the arbiter's adapter to its context");
        }
        return COSPEC_OK;
    }

    void put(int32_t j, llama_token tok, llama_pos pos, bool out) {
        batch.token[j] = tok;
        batch.pos[j] = pos;
        batch.n_seq_id[j] = 1;
        batch.seq_id[j][0] = 0;
        batch.logits[j] = out;
    }

    int32_t decode_failed(int32_t ret, const char * what) {
        return fail(ret == 2 || eng->abort_flag.load() ? COSPEC_ERR_CANCELLED : COSPEC_ERR_ARBITER,
                    std::string("arbiter: llama_decode of the ") + what + " failed with code " + std::to_string(ret));
    }

    // Make the cache of context c (whose contents `held` records) hold tokens[0..n),
    // causally, reusing the longest prefix it holds. With keep_tail, a cache that
    // holds the prefix already keeps what follows it.
    int32_t read_prefix(llama_context * c, std::vector<llama_token> & held, int32_t max_chunk,
                        const cospec_token * tokens, int32_t n, bool keep_tail, const char * what) {
        llama_memory_t mem = llama_get_memory(c);
        size_t keep = 0;
        while (keep < held.size() && keep < (size_t) n && held[keep] == tokens[keep]) {
            keep += 1;
        }
        if (keep == (size_t) n && keep_tail) {
            return COSPEC_OK;
        }
        if (keep < held.size()) {
            if (!llama_memory_seq_rm(mem, 0, (llama_pos) keep, -1)) {
                llama_memory_clear(mem, true);
                keep = 0;
            }
            held.resize(keep);
        }
        while ((int32_t) keep < n) {
            const int32_t chunk = std::min(max_chunk, n - (int32_t) keep);
            for (int32_t j = 0; j < chunk; ++j) {
                put(j, tokens[keep + j], (llama_pos) (keep + j), false);
            }
            batch.n_tokens = chunk;
            if (const int32_t ret = llama_decode(c, batch); ret != 0) {
                llama_memory_seq_rm(mem, 0, (llama_pos) keep, -1);
                return decode_failed(ret, what);
            }
            held.insert(held.end(), tokens + keep, tokens + keep + chunk);
            keep += chunk;
        }
        return COSPEC_OK;
    }

    // lora_context "adapter": the arbiter's own cache reads the prefix with the adapter.
    // Read only when a block needs a verdict: a generation that never reaches a
    // mismatch (most short answers) never pays for reading its prompt here.
    int32_t sync_prefix(const cospec_token * tokens, int32_t n) {
        llama_set_embeddings(ctx, false);
        return read_prefix(ctx, cached, n_batch, tokens, n, false, "prefix");
    }

    // lora_context "draft": make the cache hold tokens[0..n) as the draft alone
    // read them. While the engine generates, the draft's cache holds the block's
    // context already (it drafted the block from there), and its sequence is
    // copied over, a copy of memory. A block scored on its own (head_inputs,
    // score from Python) may be elsewhere: the draft reads what is missing
    // first, keeping its slot's record of what it holds true.
    int32_t copy_prefix_from_draft(const cospec_token * tokens, int32_t n) {
        model_slot & d = eng->draft;
        if (const int32_t st = read_prefix(d.ctx, d.cached, eng->n_batch, tokens, n, true, "context on the draft");
            st != COSPEC_OK) {
            return st;
        }
        llama_memory_t mem = llama_get_memory(ctx);
        const size_t size = llama_state_seq_get_size(d.ctx, 0);
        draft_state.resize(size);
        if (llama_state_seq_get_data(d.ctx, draft_state.data(), size, 0) != size ||
            llama_state_seq_set_data(ctx, draft_state.data(), size, 0) != size) {
            llama_memory_clear(mem, true);
            cached.clear();
            return fail(COSPEC_ERR_ARBITER, "arbiter: could not copy the draft's cache (its layout differs from the arbiter's)");
        }
        // The draft's cache runs on past the context with the block's drafted tokens.
        llama_memory_seq_rm(mem, 0, (llama_pos) n, -1);
        cached.assign(tokens, tokens + n);
        return COSPEC_OK;
    }

    // Hidden states of the region [d_0, t_0, d_1, t_1, ...] after the block's
    // context: the context causally (cached across blocks), the region as one
    // batch with causal attention off, so each region token sees the whole
    // context and the whole region, and the context never sees the region.
    int32_t region_hidden(const cospec_block & blk) {
        const int32_t n = blk.n_context;
        const int32_t k = blk.n_draft;
        if (2 * k > MAX_REGION) {
            return fail(COSPEC_ERR_ARBITER, "arbiter: block of " + std::to_string(k) + " tokens is too long");
        }
        if (n + 2 * k > (int32_t) llama_n_ctx(ctx)) {
            return fail(COSPEC_ERR_CONTEXT_FULL, "arbiter: the context does not fit the arbiter's window");
        }
        const int32_t st = b.context_from_draft ? copy_prefix_from_draft(blk.context, n) : sync_prefix(blk.context, n);
        if (st != COSPEC_OK) {
            return st;
        }
        llama_memory_t mem = llama_get_memory(ctx);
        for (int32_t i = 0; i < k; ++i) {
            put(2 * i, blk.draft[i], (llama_pos) (n + i), true);
            put(2 * i + 1, blk.target[i], (llama_pos) (n + i), true);
        }
        batch.n_tokens = 2 * k;
        llama_set_embeddings(ctx, true);
        llama_set_causal_attn(ctx, false);
        const int32_t ret = llama_decode(ctx, batch);
        int32_t status = COSPEC_OK;
        if (ret != 0) {
            status = decode_failed(ret, "region");
        } else {
            const int32_t d = b.n_embd;
            hidden.resize((size_t) 2 * k * d);
            for (int32_t j = 0; j < 2 * k && status == COSPEC_OK; ++j) {
                const float * e = llama_get_embeddings_ith(ctx, j);
                if (e == nullptr) {
                    status = fail(COSPEC_ERR_ARBITER, "arbiter: llama.cpp returned no hidden state");
                } else {
                    std::copy(e, e + d, hidden.begin() + (size_t) j * d);
                }
            }
        }
        // The region never stays: the next block's context continues from the prefix.
        llama_memory_seq_rm(mem, 0, (llama_pos) n, -1);
        llama_set_causal_attn(ctx, true);
        llama_set_embeddings(ctx, false);
        return status;
    }

    // The head's input row for every position of the block (only_mismatches: the features of the
    // rows the head reads, the others zeros).
    int32_t build_inputs(const cospec_block & blk, bool only_mismatches = false) {
        const int32_t k = blk.n_draft;
        features.resize((size_t) k * COSPEC_N_FEATURES);
        if (const int32_t st = cospec::block_features(&blk, features.data(), features.size(),
                                                      only_mismatches ? blk.mismatch : nullptr);
            st != COSPEC_OK) {
            return st;
        }
        const int32_t c = cols();
        inputs.resize((size_t) k * c);
        if (b.kind == COSPEC_ARBITER_FEATURES) {
            std::copy(features.begin(), features.end(), inputs.begin());
            return COSPEC_OK;
        }
        if (const int32_t st = region_hidden(blk); st != COSPEC_OK) {
            return st;
        }
        const int32_t d = b.n_embd;
        for (int32_t i = 0; i < k; ++i) {
            float * row = inputs.data() + (size_t) i * c;
            std::copy_n(hidden.begin() + (size_t) (2 * i) * d, d, row);
            std::copy_n(hidden.begin() + (size_t) (2 * i + 1) * d, d, row + d);
            std::copy_n(features.begin() + (size_t) i * COSPEC_N_FEATURES, COSPEC_N_FEATURES, row + 2 * d);
        }
        return COSPEC_OK;
    }

    int32_t head_inputs(const cospec_block & blk, float * out, size_t out_size) override {
        if (out_size / cols() < (size_t) blk.n_draft) {
            return fail(COSPEC_ERR_INVALID_ARGUMENT, "arbiter head inputs: output too small");
        }
        if (const int32_t st = build_inputs(blk); st != COSPEC_OK) {
            return st;
        }
        std::copy(inputs.begin(), inputs.end(), out);
        return cols();
    }

    int32_t score(const cospec_block & blk, float * p_keep) override {
        const int32_t k = blk.n_draft;
        std::fill(p_keep, p_keep + k, 0.0f);
        if (const int32_t st = build_inputs(blk, true); st != COSPEC_OK) {
            return st;
        }
        const int32_t c = cols();
        rows.clear();
        std::vector<int32_t> at;
        for (int32_t i = 0; i < k; ++i) {
            if (blk.mismatch[i]) {
                rows.insert(rows.end(), inputs.begin() + (size_t) i * c, inputs.begin() + (size_t) (i + 1) * c);
                at.push_back(i);
            }
        }
        const int32_t n_rows = (int32_t) at.size();
        probs.assign((size_t) n_rows, 0.0f);
        if (n_rows == 0) {
            return COSPEC_OK;
        }
        if (head_fn != nullptr) {
            if (const int32_t rc = head_fn(head_user_data, rows.data(), n_rows, c, probs.data()); rc != 0) {
                return fail(COSPEC_ERR_ARBITER, "arbiter head callback reported error " + std::to_string(rc));
            }
        } else {
            for (int32_t r = 0; r < n_rows; ++r) {
                probs[r] = b.head(rows.data() + (size_t) r * c, scratch_a, scratch_b);
            }
        }
        for (int32_t r = 0; r < n_rows; ++r) {
            if (!(probs[r] >= 0.0f && probs[r] <= 1.0f)) {
                return fail(COSPEC_ERR_ARBITER, "arbiter head returned " + std::to_string(probs[r]) + ", not a probability");
            }
            p_keep[at[r]] = probs[r];
        }
        return COSPEC_OK;
    }
};

} // namespace

extern "C" {

cospec_learned_arbiter_params cospec_learned_arbiter_default_params(void) {
    cospec_learned_arbiter_params p {};
    p.path = nullptr;
    p.threshold = -1.0f;
    p.head = nullptr;
    p.head_user_data = nullptr;
    p.n_threads = 0;
    p.fold_adapter = true;
    p.use_gate = true;
    return p;
}

int32_t cospec_arbiter_load(cospec_engine * engine, const cospec_learned_arbiter_params * params, cospec_arbiter ** out) {
    cospec::clear_error();
    if (out == nullptr || engine == nullptr || params == nullptr || params->path == nullptr || params->path[0] == '\0') {
        return fail(COSPEC_ERR_INVALID_ARGUMENT, "cospec_arbiter_load: engine, params, params->path and out are required");
    }
    *out = nullptr;
    if (!engine->has_draft) {
        return fail(COSPEC_ERR_NO_DRAFT, "a learned arbiter runs on the draft model, but the engine was opened without one");
    }
    if (!(params->threshold <= 1.0f) || params->n_threads < 0 || params->n_threads > GGML_MAX_N_THREADS) {
        return fail(COSPEC_ERR_INVALID_ARGUMENT, "arbiter threshold must be <= 1 (< 0: the arbiter's own) and n_threads >= 0");
    }
    try {
        auto a = std::make_unique<learned_arbiter>();
        a->eng = engine;
        if (const int32_t st = read_bundle(params->path, a->b); st != COSPEC_OK) {
            return st;
        }
        if (engine->draft_fingerprint.empty()) {
            if (const int32_t st = cospec::model_fingerprint(engine->draft_path.c_str(), engine->draft_fingerprint,
                                                                 &engine->draft_header);
                st != COSPEC_OK) {
                return st;
            }
        }
        const std::string & want = a->b.draft_fingerprint;
        if (want != engine->draft_fingerprint) {
            const std::string & file = a->b.draft_file;
            return fail(COSPEC_ERR_ARBITER_DRAFT, "arbiter '" + a->b.path + "' was made for another draft model (" +
                                                (!file.empty() ? "'" + file + "', " : std::string()) +
                                                "fingerprint " + want + "); this engine's draft '" + engine->draft_path +
                                                "' has fingerprint " + engine->draft_fingerprint);
        }
        const char * kind_name = cospec_arbiter_kind_name(a->b.kind);
        const int32_t expected = a->b.kind == COSPEC_ARBITER_LORA ? 2 * a->b.n_embd + COSPEC_N_FEATURES : COSPEC_N_FEATURES;
        if (a->b.kind == COSPEC_ARBITER_LORA && a->b.n_embd != llama_model_n_embd(engine->draft.model)) {
            return fail(COSPEC_ERR_ARBITER, "arbiter '" + a->b.path + "' expects hidden states of width " +
                                                std::to_string(a->b.n_embd) + ", the draft has " +
                                                std::to_string(llama_model_n_embd(engine->draft.model)));
        }
        if (a->b.head.n_in() != expected) {
            return fail(COSPEC_ERR_ARBITER, "arbiter '" + a->b.path + "': the head reads " + std::to_string(a->b.head.n_in()) +
                                                " inputs, a " + kind_name + " arbiter gives " + std::to_string(expected));
        }
        if (a->b.has_gate() && a->b.gate_n_vocab != engine->target.n_vocab) {
            return fail(COSPEC_ERR_ARBITER, "arbiter '" + a->b.path + "': its domain gate was built for a vocabulary of " +
                                                std::to_string(a->b.gate_n_vocab) + " tokens, the target has " +
                                                std::to_string(engine->target.n_vocab));
        }
        a->gate_on = params->use_gate && a->b.has_gate();
        a->keep_threshold = params->threshold >= 0.0f ? params->threshold : a->b.threshold;
        a->head_fn = params->head;
        a->head_user_data = params->head_user_data;
        a->label = !a->b.name.empty() ? a->b.name : std::string("cospec-") + kind_name;
        if (a->b.kind == COSPEC_ARBITER_LORA) {
            if (const int32_t st = a->open_lora(*params); st != COSPEC_OK) {
                return st;
            }
        }
        *out = a.release();
        return COSPEC_OK;
    } catch (const std::exception & ex) {
        return fail(COSPEC_ERR_INTERNAL, std::string("arbiter load failed: ") + ex.what());
    }
}

float cospec_arbiter_gate_coverage(const cospec_arbiter * arbiter, const cospec_token * prompt, int32_t n_prompt) {
    cospec::clear_error();
    const auto * a = dynamic_cast<const learned_arbiter *>(arbiter);
    if (a == nullptr || !a->b.has_gate() || (prompt == nullptr && n_prompt > 0) || n_prompt < 0) {
        return (float) fail(COSPEC_ERR_INVALID_ARGUMENT, "gate coverage: a learned arbiter with a domain gate and a "
                                                          "prompt are needed");
    }
    return (float) gate_score(a->b, prompt, n_prompt);
}

bool cospec_arbiter_admits(const cospec_arbiter * arbiter, const cospec_token * prompt, int32_t n_prompt) {
    return arbiter != nullptr && (prompt != nullptr || n_prompt == 0) && n_prompt >= 0 && arbiter->admits(prompt, n_prompt);
}

} // extern "C"
