// Reading arbiter.gguf (arbiter_file.h): its cospec.arbiter.* metadata, the head's layers and the
// domain gate, every value checked before use.
#include "arbiter_file.h"

#include "internal.h"

#include <cfloat>
#include <cstring>
#include <memory>
#include <string_view>
#include <sys/stat.h>

using cospec::fail;

namespace cospec {

namespace {

constexpr const char * KEY_PREFIX = "cospec.arbiter.";
constexpr uint32_t FORMAT_VERSION = COSPEC_ARBITER_FORMAT_VERSION;
// The domain gate's bigrams (cospec_local/arbiter/domain_gate.py): a tensor (n, 2) of token ids.
constexpr const char * GATE_TENSOR = "gate.bigrams";
constexpr int64_t MAX_GATE_BIGRAMS = 1 << 24; // 128 MiB of keys: far past any training set's prompts
// A classifier gate's weights over hashed token unigrams and bigrams: a tensor (2^bits) of F32.
constexpr const char * CLASSIFIER_GATE_TENSOR = "gate.weights";
constexpr int32_t MAX_GATE_HASH_BITS = 24;
// An embedding gate's weights over the draft's hidden state at the prompt's last token (prompt_embedding.h):
// a tensor (n_embd) of F32, with gate_bias and gate_threshold.
constexpr const char * EMBEDDING_GATE_TENSOR = "gate.embedding";
// domain_gate.hashed_features: a unigram t hashes (t + 1) * A, a bigram (s, t) (s + 1) * A + (t + 1) * B.
constexpr uint64_t GATE_HASH_FIRST = 0x9E3779B97F4A7C15ull;
constexpr uint64_t GATE_HASH_SECOND = 0xC2B2AE3D27D4EB4Full;
// Bounds on a head read from an untrusted file.
constexpr int64_t MAX_HEAD_WIDTH = 1 << 16;
constexpr uint32_t MAX_HEAD_LAYERS = 8;
constexpr size_t MAX_HEAD_BYTES = 256u << 20;

} // namespace

std::string parent_dir(const std::string & path) {
    const size_t slash = path.find_last_of('/');
    return slash == std::string::npos ? "." : path.substr(0, slash);
}

bool is_dir(const std::string & path) {
    struct stat st {};
    return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::optional<int32_t> learned_kind(const std::string & name) {
    for (const int32_t kind : {COSPEC_ARBITER_FEATURES, COSPEC_ARBITER_LORA}) {
        if (name == cospec_arbiter_kind_name(kind)) {
            return kind;
        }
    }
    return std::nullopt;
}

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

// A gate's number (gate_bias, gate_threshold) as a float: the whole text, finite, in [lo, hi].
bool gate_float(const std::string & text, float lo, float hi, float & out) {
    char * end = nullptr;
    out = std::strtof(text.c_str(), &end);
    return end != text.c_str() && *end == '\0' && std::isfinite(out) && out >= lo && out <= hi;
}

// A gate's F32 weights (a 1-D tensor whose shape the caller checked), copied: each finite and
// below 1e6 in magnitude.
int32_t copy_gate_weights(const ggml_tensor * t, const char * name, const std::string & who, std::vector<float> & out) {
    const float * w = (const float *) t->data;
    out.assign(w, w + t->ne[0]);
    if (!std::all_of(out.begin(), out.end(), [](float x) { return std::isfinite(x) && std::fabs(x) < 1e6f; })) {
        return fail(COSPEC_ERR_ARBITER, who + ": tensor '" + name + "' holds a weight that is not a finite number");
    }
    return COSPEC_OK;
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
    if (!gate_float(bias->second, -FLT_MAX, FLT_MAX, b.gate_bias)) {
        return fail(COSPEC_ERR_ARBITER, who + ": gate_bias must be a finite number");
    }
    if (t->type != GGML_TYPE_F32 || t->ne[0] != ((int64_t) 1 << n_bits) || t->ne[1] != 1 || t->ne[2] != 1 || t->ne[3] != 1) {
        return fail(COSPEC_ERR_ARBITER, who + ": tensor '" + CLASSIFIER_GATE_TENSOR + "' must hold 2^gate_hash_bits F32 weights");
    }
    return copy_gate_weights(t, CLASSIFIER_GATE_TENSOR, who, b.gate_weights);
}

// gate.embedding, gate_bias and gate_threshold, checked before use: finite weights, one per
// hidden unit (the draft's width is checked when the arbiter loads on an engine).
int32_t read_embedding_gate(const ggml_tensor * t, const std::string & who, bundle & b) {
    for (const char * key : {"gate_n_vocab", "gate_hash_bits"}) {
        if (b.meta.count(key) != 0) {
            return fail(COSPEC_ERR_ARBITER, who + ": " + key + " beside the embedding gate's tensor '" +
                                                EMBEDDING_GATE_TENSOR + "'");
        }
    }
    const auto bias = b.meta.find("gate_bias");
    const auto threshold = b.meta.find("gate_threshold");
    if (bias == b.meta.end() || threshold == b.meta.end()) {
        return fail(COSPEC_ERR_ARBITER, who + ": tensor '" + EMBEDDING_GATE_TENSOR + "' without gate_bias and gate_threshold");
    }
    if (!gate_float(bias->second, -FLT_MAX, FLT_MAX, b.gate_bias)) {
        return fail(COSPEC_ERR_ARBITER, who + ": gate_bias must be a finite number");
    }
    if (!gate_float(threshold->second, 0.0f, 1.0f, b.gate_threshold)) {
        return fail(COSPEC_ERR_ARBITER, who + ": gate_threshold must lie in [0, 1]");
    }
    if (t->type != GGML_TYPE_F32 || t->ne[0] < 1 || t->ne[0] > (1 << 20) || t->ne[1] != 1 || t->ne[2] != 1 || t->ne[3] != 1) {
        return fail(COSPEC_ERR_ARBITER, who + ": tensor '" + EMBEDDING_GATE_TENSOR + "' must hold one F32 weight per hidden unit");
    }
    return copy_gate_weights(t, EMBEDDING_GATE_TENSOR, who, b.gate_embedding);
}

// gate.bigrams and its two keys, checked before use: ids inside the vocabulary, keys strictly
// increasing (what binary search needs), a threshold in [0, 1].
int32_t read_gate(ggml_context * ctx, const std::string & who, bundle & b) {
    const ggml_tensor * t = ggml_get_tensor(ctx, GATE_TENSOR);
    const ggml_tensor * weights = ggml_get_tensor(ctx, CLASSIFIER_GATE_TENSOR);
    if (const ggml_tensor * embedding = ggml_get_tensor(ctx, EMBEDDING_GATE_TENSOR); embedding != nullptr) {
        if (t != nullptr || weights != nullptr) {
            return fail(COSPEC_ERR_ARBITER, who + ": two domain gates ('" + EMBEDDING_GATE_TENSOR + "' and another)");
        }
        return read_embedding_gate(embedding, who, b);
    }
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
    if (!gate_float(threshold->second, 0.0f, 1.0f, b.gate_threshold)) {
        return fail(COSPEC_ERR_ARBITER, who + ": gate_threshold must lie in [0, 1]");
    }
    char * end = nullptr;
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
    if (!meta_number(b, "n_features", 1.0, COSPEC_N_FEATURES, true, v)) {
        return fail(COSPEC_ERR_ARBITER, who + ": n_features must be a whole number in [1, " +
                                            std::to_string(COSPEC_N_FEATURES) +
                                            "] (an arbiter for a newer engine: update cospec-local)");
    }
    if (v) {
        b.n_features = (int32_t) *v;
    }
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

} // namespace cospec
