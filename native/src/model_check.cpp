// Checks of a model file's metadata and tensor infos before llama.cpp loads
// it. llama.cpp asserts (aborting the process) on some values an untrusted
// file can hold; each check here refuses such a file with a message instead.
// Found with the corpus of structured corruptions in tests/gguf_corpus.py.
#include "internal.h"

#include "ggml.h"
#include "gguf.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace {

constexpr uint32_t MAX_LAYERS = 512;     // llama.cpp's LLAMA_MAX_LAYERS
constexpr uint32_t MIN_ALIGNMENT = 32;   // GGUF's default; 8 and 16 reached an alignment assert in llama.cpp

struct gguf_free_deleter {
    void operator()(gguf_context * g) const { gguf_free(g); }
};
struct ggml_free_deleter {
    void operator()(ggml_context * c) const { ggml_free(c); }
};

// A numeric scalar of any integer or float type, as double; false if absent or not numeric.
bool number(const gguf_context * g, const std::string & key, double & out) {
    const int64_t id = gguf_find_key(g, key.c_str());
    if (id < 0) {
        return false;
    }
    switch (gguf_get_kv_type(g, id)) {
        case GGUF_TYPE_UINT8:   out = gguf_get_val_u8(g, id); return true;
        case GGUF_TYPE_INT8:    out = gguf_get_val_i8(g, id); return true;
        case GGUF_TYPE_UINT16:  out = gguf_get_val_u16(g, id); return true;
        case GGUF_TYPE_INT16:   out = gguf_get_val_i16(g, id); return true;
        case GGUF_TYPE_UINT32:  out = gguf_get_val_u32(g, id); return true;
        case GGUF_TYPE_INT32:   out = gguf_get_val_i32(g, id); return true;
        case GGUF_TYPE_UINT64:  out = (double) gguf_get_val_u64(g, id); return true;
        case GGUF_TYPE_INT64:   out = (double) gguf_get_val_i64(g, id); return true;
        case GGUF_TYPE_FLOAT32: out = gguf_get_val_f32(g, id); return true;
        case GGUF_TYPE_FLOAT64: out = gguf_get_val_f64(g, id); return true;
        default:                return false;
    }
}

std::string text(const gguf_context * g, const std::string & key) {
    const int64_t id = gguf_find_key(g, key.c_str());
    return id >= 0 && gguf_get_kv_type(g, id) == GGUF_TYPE_STRING ? gguf_get_val_str(g, id) : "";
}

// The entries of a per-layer value (a scalar, or an array of integers), one per layer; a scalar
// stands for every layer, as llama.cpp's get_key_or_arr reads it. False when the key is absent
// or of a type llama.cpp rejects itself.
bool per_layer(const gguf_context * g, const std::string & key, size_t n_layer, std::vector<int64_t> & out) {
    out.clear();
    const int64_t id = gguf_find_key(g, key.c_str());
    if (id < 0) {
        return false;
    }
    if (gguf_get_kv_type(g, id) != GGUF_TYPE_ARRAY) {
        double v = 0;
        if (!number(g, key, v)) {
            return false;
        }
        out.assign(n_layer, v > 0 ? (int64_t) v : 0);
        return true;
    }
    const gguf_type t = gguf_get_arr_type(g, id);
    const size_t n = std::min(gguf_get_arr_n(g, id), n_layer);
    const void * data = gguf_get_arr_data(g, id);
    for (size_t i = 0; i < n; ++i) {
        switch (t) {
            case GGUF_TYPE_UINT32: out.push_back(((const uint32_t *) data)[i]); break;
            case GGUF_TYPE_INT32:  out.push_back(((const int32_t *) data)[i]); break;
            case GGUF_TYPE_UINT16: out.push_back(((const uint16_t *) data)[i]); break;
            case GGUF_TYPE_INT16:  out.push_back(((const int16_t *) data)[i]); break;
            case GGUF_TYPE_UINT8:  out.push_back(((const uint8_t *) data)[i]); break;
            case GGUF_TYPE_INT8:   out.push_back(((const int8_t *) data)[i]); break;
            default:               out.clear(); return false; // llama.cpp rejects other element types itself
        }
    }
    return true;
}

// Architectures whose layers are not all attention layers, as llama.cpp lists them
// (llm_arch_is_recurrent and llm_arch_is_hybrid in src/llama-arch.cpp of the pinned version).
// Their files write a zero head count for a recurrent layer and a zero FFN length for a layer
// without a feed-forward block, on purpose; in every other architecture a zero divides by zero
// inside llama.cpp.
const std::unordered_set<std::string_view> RECURRENT_ARCHS = {
    "mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7",
};
const std::unordered_set<std::string_view> HYBRID_ARCHS = {
    "jamba", "falcon-h1", "plamo2", "granitehybrid", "lfm2", "lfm2moe", "nemotron_h", "nemotron_h_moe",
    "qwen3next", "kimi-linear", "bailingmoe3", "kimi-k3", "glm5-next", "qwen35", "qwen35moe", "qwen4exp",
    "deepseek4", "minimax-01",
};
// Architectures whose rotary embedding is always multi-section (their loader requires
// rope.dimension_sections): sections that add up to 0 divide by zero in ggml's mRoPE kernel.
const std::unordered_set<std::string_view> MROPE_ARCHS = {
    "qwen2vl", "qwen3vl", "qwen3vlmoe", "qwen35", "qwen35moe", "qwen4exp",
};
constexpr double MAX_EXPERTS = 1024; // llama.cpp's LLAMA_MAX_EXPERTS

int32_t refuse(const std::string & who, const std::string & why) {
    return cospec::fail(COSPEC_ERR_MODEL_LOAD, who + ": " + why);
}

// Head counts and FFN widths, read per layer kind as llama.cpp reads them.
int32_t check_layer_widths(const std::string & who, const gguf_context * g, const std::string & arch, size_t n_layer) {
    // deci's linear layers have no heads; a recurrent model has no attention at all.
    if (arch == "deci" || RECURRENT_ARCHS.count(arch) > 0) {
        return COSPEC_OK;
    }
    const std::string heads_key = arch + ".attention.head_count";
    const std::string kv_key = arch + ".attention.head_count_kv";
    std::vector<int64_t> heads, kv;
    const bool has_heads = per_layer(g, heads_key, n_layer, heads);
    if (!per_layer(g, kv_key, n_layer, kv)) {
        kv = heads; // llama.cpp: the KV head count defaults to the head count
    }
    if (HYBRID_ARCHS.count(arch) > 0) {
        // A hybrid's layer is recurrent where its KV head count is 0 (llama.cpp's layer kinds);
        // an attention layer needs heads. Layers without a feed-forward block write a zero width.
        for (size_t i = 0; i < kv.size(); ++i) {
            const int64_t n_head = has_heads && i < heads.size() ? heads[i] : 0;
            if (kv[i] < 0 || n_head < 0) {
                return refuse(who, kv_key + " has a negative entry at layer " + std::to_string(i));
            }
            if (kv[i] > 0 && n_head == 0) {
                return refuse(who, heads_key + " is 0 at layer " + std::to_string(i) + ", an attention layer (" +
                                       kv_key + " " + std::to_string(kv[i]) + ")");
            }
        }
        return COSPEC_OK;
    }
    const auto has_zero = [](const std::vector<int64_t> & values) {
        return std::any_of(values.begin(), values.end(), [](int64_t v) { return v <= 0; });
    };
    if (has_zero(heads)) {
        return refuse(who, heads_key + " has a zero entry");
    }
    if (has_zero(kv)) {
        return refuse(who, kv_key + " has a zero entry");
    }
    const std::string ffn_key = arch + ".feed_forward_length";
    std::vector<int64_t> ffn;
    if (per_layer(g, ffn_key, n_layer, ffn) && has_zero(ffn)) {
        return refuse(who, ffn_key + " has a zero entry");
    }
    return COSPEC_OK;
}

// The expert counts llama.cpp asserts on while reading them (llama_model_base::load_hparams).
int32_t check_experts(const std::string & who, const gguf_context * g, const std::string & arch, size_t n_layer) {
    double n_expert = 0, n_groups = 0, n_group_used = 0;
    number(g, arch + ".expert_count", n_expert);
    number(g, arch + ".expert_group_count", n_groups);
    number(g, arch + ".expert_group_used_count", n_group_used);
    std::vector<int64_t> used;
    per_layer(g, arch + ".expert_used_count", n_layer, used);
    const double used_max = used.empty() ? 0.0 : (double) *std::max_element(used.begin(), used.end());
    if ((arch == "hunyuan-dense" || arch == "hunyuan_vl") && n_expert <= 1) {
        return COSPEC_OK; // llama.cpp reads these as dense models
    }
    const std::string count = arch + ".expert_count " + std::to_string((long long) n_expert);
    if (!(n_expert >= 0 && n_expert <= MAX_EXPERTS)) {
        return refuse(who, arch + ".expert_count must be between 0 and " + std::to_string((int) MAX_EXPERTS));
    }
    if (std::any_of(used.begin(), used.end(), [](int64_t v) { return v < 0; }) || used_max > n_expert) {
        return refuse(who, arch + ".expert_used_count must be between 0 and the " + count);
    }
    if (n_expert == 0) {
        if (used_max > 0 || n_groups != 0) {
            return refuse(who, arch + ".expert_used_count and expert_group_count must be 0 without experts");
        }
        return COSPEC_OK;
    }
    if (used_max == 0) {
        return refuse(who, arch + ".expert_used_count must be positive with " + count);
    }
    if (!(n_groups >= 0 && n_groups < n_expert)) {
        return refuse(who, arch + ".expert_group_count must be below the " + count);
    }
    if (n_groups > 1 && (std::fmod(n_expert, n_groups) != 0 || !(n_group_used > 0 && n_group_used < n_groups))) {
        return refuse(who, arch + ".expert_group_count must divide the " + count +
                               " and expert_group_used_count be between 1 and it, exclusive");
    }
    return COSPEC_OK;
}

// The attention head's width as llama.cpp reads it: key_length, else the embedding over the first
// layer's head count (0 where neither says).
double head_width(const gguf_context * g, const std::string & arch) {
    double head_dim = 0, n_embd = 0;
    std::vector<int64_t> heads;
    if (!number(g, arch + ".attention.key_length", head_dim) && number(g, arch + ".embedding_length", n_embd) &&
        per_layer(g, arch + ".attention.head_count", 1, heads) && !heads.empty() && heads[0] > 0) {
        head_dim = std::floor(n_embd / (double) heads[0]);
    }
    return head_dim;
}

// Multi-section rotary embedding (mRoPE): ggml's kernel asserts that the sections fit the head
// (GGML_ASSERT(sect_dims <= ne0)) and divides by their sum.
int32_t check_rope_sections(const std::string & who, const gguf_context * g, const std::string & arch) {
    const std::string key = arch + ".rope.dimension_sections";
    std::vector<int64_t> sections;
    if (!per_layer(g, key, 4, sections)) {
        return COSPEC_OK; // absent: llama.cpp refuses the file itself where the architecture needs it
    }
    int64_t sum = 0;
    for (const int64_t v : sections) {
        if (v < 0) {
            return refuse(who, key + " has a negative entry");
        }
        sum += v;
    }
    if (sum == 0 && MROPE_ARCHS.count(arch) > 0) {
        return refuse(who, key + " adds up to 0");
    }
    const double head_dim = head_width(g, arch);
    if (head_dim > 0 && (double) sum > head_dim) {
        return refuse(who, key + " add up to " + std::to_string(sum) + ", past the head's " +
                               std::to_string((long long) head_dim) + " dimensions");
    }
    return COSPEC_OK;
}

// Rotary dimensions: ggml's rope kernels assert that they are even and fit the head
// (GGML_ASSERT(n_dims <= ne0), GGML_ASSERT(n_dims % 2 == 0)). llama.cpp itself demands the whole
// head of llama-graph architectures (llama, deci, falcon); an EAGLE-3 head runs llama's layer too.
int32_t check_rope_dimensions(const std::string & who, const gguf_context * g, const std::string & arch) {
    const double head_dim = head_width(g, arch);
    if (!(head_dim > 0)) {
        return COSPEC_OK; // no attention heads to rotate, or llama.cpp refuses the file itself
    }
    for (const char * suffix : {".rope.dimension_count", ".rope.dimension_count_swa"}) {
        const std::string key = arch + suffix;
        double n_rot = 0;
        if (!number(g, key, n_rot)) {
            continue;
        }
        const std::string dims = std::to_string((long long) head_dim);
        if (arch == "eagle3" && n_rot != head_dim) {
            return refuse(who, key + " must be the head's " + dims + " dimensions, as in llama's layer");
        }
        if (n_rot > head_dim || std::fmod(n_rot, 2.0) != 0) {
            return refuse(who, key + " must be even and at most the head's " + dims + " dimensions");
        }
    }
    return COSPEC_OK;
}

} // namespace

namespace cospec {

// llama_adapter_lora_init reads these keys with typed getters, which assert on another type.
int32_t check_adapter_metadata(const char * role, const char * path) {
    const std::string who = std::string(role) + " '" + path + "'";
    gguf_init_params gp {};
    gp.no_alloc = true;
    std::unique_ptr<gguf_context, gguf_free_deleter> g(gguf_init_from_file(path, gp));
    if (!g) {
        return fail(COSPEC_ERR_MODEL_LOAD, who + ": corrupt GGUF header");
    }
    const struct { const char * key; gguf_type type; } typed[] = {
        {"general.type", GGUF_TYPE_STRING},
        {"general.architecture", GGUF_TYPE_STRING},
        {"adapter.type", GGUF_TYPE_STRING},
        {"adapter.lora.alpha", GGUF_TYPE_FLOAT32},
    };
    for (const auto & [key, type] : typed) {
        const int64_t id = gguf_find_key(g.get(), key);
        if (id >= 0 && gguf_get_kv_type(g.get(), id) != type) {
            return fail(COSPEC_ERR_MODEL_LOAD, who + ": " + key + " must be a " + gguf_type_name(type) + ", not a " +
                                                   gguf_type_name(gguf_get_kv_type(g.get(), id)));
        }
    }
    // A non-finite alpha scales the adapter's term into NaN at every decode.
    if (const int64_t id = gguf_find_key(g.get(), "adapter.lora.alpha");
        id >= 0 && !std::isfinite(gguf_get_val_f32(g.get(), id))) {
        return fail(COSPEC_ERR_MODEL_LOAD, who + ": adapter.lora.alpha must be a finite number");
    }
    return COSPEC_OK;
}

int32_t check_model_metadata(const char * role, const char * path) {
    const std::string who = std::string(role) + " '" + path + "'";
    ggml_context * raw_meta = nullptr;
    gguf_init_params gp {};
    gp.no_alloc = true;
    gp.ctx = &raw_meta;
    std::unique_ptr<gguf_context, gguf_free_deleter> g(gguf_init_from_file(path, gp));
    std::unique_ptr<ggml_context, ggml_free_deleter> meta(raw_meta);
    if (!g) {
        return fail(COSPEC_ERR_MODEL_LOAD, who + ": corrupt GGUF header");
    }
    return check_loaded_model_metadata(who, g.get(), meta.get());
}

int32_t check_loaded_model_metadata(const std::string & who, const gguf_context * g, const ggml_context * tensors) {
    const auto bad = [&](const std::string & why) { return fail(COSPEC_ERR_MODEL_LOAD, who + ": " + why); };

    double alignment = 0;
    if (number(g, "general.alignment", alignment) && alignment < MIN_ALIGNMENT) {
        return bad("general.alignment " + std::to_string((long long) alignment) + " is below " +
                   std::to_string(MIN_ALIGNMENT));
    }
    const std::string arch = text(g, "general.architecture");
    if (arch.empty()) {
        return bad("no general.architecture");
    }
    double n_layer = 0;
    if (!number(g, arch + ".block_count", n_layer) || !(n_layer >= 1 && n_layer <= MAX_LAYERS)) {
        return bad(arch + ".block_count must be between 1 and " + std::to_string(MAX_LAYERS));
    }
    for (const char * key : {".attention.layer_norm_rms_epsilon", ".attention.layer_norm_epsilon"}) {
        double eps = 0;
        if (number(g, arch + key, eps) && !(std::isfinite(eps) && eps >= 0)) {
            return bad(arch + key + " must be a finite number >= 0");
        }
    }
    for (const char * key : {".rope.freq_base", ".rope.scaling.factor"}) {
        double v = 0;
        if (number(g, arch + key, v) && !(std::isfinite(v) && v > 0)) {
            return bad(arch + key + " must be a finite positive number");
        }
    }
    if (const int32_t status = check_layer_widths(who, g, arch, (size_t) n_layer); status != COSPEC_OK) {
        return status;
    }
    if (const int32_t status = check_experts(who, g, arch, (size_t) n_layer); status != COSPEC_OK) {
        return status;
    }
    if (const int32_t status = check_rope_sections(who, g, arch); status != COSPEC_OK) {
        return status;
    }
    if (const int32_t status = check_rope_dimensions(who, g, arch); status != COSPEC_OK) {
        return status;
    }
    const std::string tokenizer = text(g, "tokenizer.ggml.model");
    if (tokenizer == "bert" || tokenizer == "no_vocab") {
        return bad("tokenizer model '" + tokenizer + "' is not one a generative model can run with");
    }
    // Token texts must be unique as llama.cpp's vocabulary loader names them, or it aborts
    // (GGML_ASSERT(id_to_token.size() == token_to_id.size())): it reads each text as a C string
    // ("a\0b" is "a") and names an empty one "[EMPTY_<id>]", which another token may spell.
    const int64_t tokens = gguf_find_key(g, "tokenizer.ggml.tokens");
    if (tokens >= 0 && gguf_get_kv_type(g, tokens) == GGUF_TYPE_ARRAY &&
        gguf_get_arr_type(g, tokens) == GGUF_TYPE_STRING) {
        const size_t n = gguf_get_arr_n(g, tokens);
        std::unordered_map<std::string, size_t> seen;
        seen.reserve(n);
        for (size_t i = 0; i < n; ++i) {
            std::string word = gguf_get_arr_str(g, tokens, i);  // up to its first NUL, as llama.cpp reads it
            const bool renamed = word.empty();
            if (renamed) {
                word = "[EMPTY_" + std::to_string(i) + "]";
            }
            const auto [at, inserted] = seen.emplace(word, i);
            if (!inserted) {
                const bool named = renamed || at->first.rfind("[EMPTY_", 0) == 0;
                return bad("tokens " + std::to_string(at->second) + " and " + std::to_string(i) + " have the same text" +
                           (named ? " as llama.cpp reads them (it names an empty token text [EMPTY_<id>])" : ""));
            }
        }
    }
    // Norm weights are F32 vectors; another type reaches a kernel that asserts.
    for (int64_t i = 0; i < gguf_get_n_tensors(g); ++i) {
        const std::string name = gguf_get_tensor_name(g, i);
        const size_t suffix = name.size() >= 12 ? name.size() - 12 : 0;
        if (name.compare(suffix, std::string::npos, "_norm.weight") == 0) {
            if (gguf_get_tensor_type(g, i) != GGML_TYPE_F32) {
                return bad("norm tensor '" + name + "' must be F32, not " + ggml_type_name(gguf_get_tensor_type(g, i)));
            }
            const ggml_tensor * t = tensors ? ggml_get_tensor(const_cast<ggml_context *>(tensors), name.c_str()) : nullptr;
            if (t != nullptr && ggml_n_dims(t) != 1) {
                return bad("norm tensor '" + name + "' must be a vector");
            }
        }
    }
    return COSPEC_OK;
}

} // namespace cospec
