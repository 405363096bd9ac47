// Checks of a model file's metadata and tensor infos before llama.cpp loads
// it. llama.cpp asserts (aborting the process) on some values an untrusted
// file can hold; each check here refuses such a file with a message instead.
// Found with the corpus of structured corruptions in tests/gguf_corpus.py.
#include "internal.h"

#include "ggml.h"
#include "gguf.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

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

// Every entry of a per-layer value (a scalar, or an array of integers) must be positive.
bool has_zero_entry(const gguf_context * g, const std::string & key) {
    const int64_t id = gguf_find_key(g, key.c_str());
    if (id < 0) {
        return false;
    }
    if (gguf_get_kv_type(g, id) != GGUF_TYPE_ARRAY) {
        double v = 0;
        return number(g, key, v) && !(v > 0);
    }
    const gguf_type t = gguf_get_arr_type(g, id);
    const size_t n = gguf_get_arr_n(g, id);
    const void * data = gguf_get_arr_data(g, id);
    for (size_t i = 0; i < n; ++i) {
        int64_t v = 1;
        switch (t) {
            case GGUF_TYPE_UINT32: v = ((const uint32_t *) data)[i]; break;
            case GGUF_TYPE_INT32:  v = ((const int32_t *) data)[i]; break;
            case GGUF_TYPE_UINT16: v = ((const uint16_t *) data)[i]; break;
            case GGUF_TYPE_INT16:  v = ((const int16_t *) data)[i]; break;
            case GGUF_TYPE_UINT8:  v = ((const uint8_t *) data)[i]; break;
            case GGUF_TYPE_INT8:   v = ((const int8_t *) data)[i]; break;
            default:               return false; // llama.cpp rejects other element types itself
        }
        if (v <= 0) {
            return true;
        }
    }
    return false;
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
    // A layer without attention heads is a real thing in some architectures (deci's linear layers);
    // in the others a 0 divides by zero inside llama.cpp.
    if (arch != "deci") {
        for (const char * key : {".attention.head_count", ".attention.head_count_kv", ".feed_forward_length"}) {
            if (has_zero_entry(g, arch + key)) {
                return bad(arch + key + " has a zero entry");
            }
        }
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
