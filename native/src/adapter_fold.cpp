// Folding a LoRA adapter into the draft's weights (adapter_fold.h).
#include "adapter_fold.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <set>
#include <string_view>
#include <sys/stat.h>
#include <vector>

namespace cospec {

namespace {

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

} // namespace

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
        const bool locked = eng.load_mode == LLAMA_LOAD_MODE_MLOCK || eng.load_mode == LLAMA_LOAD_MODE_MMAP_MLOCK;
        mp.load_mode = locked ? LLAMA_LOAD_MODE_MLOCK : mp.load_mode;
        if (!eng.devices[1].empty()) {
            mp.devices = const_cast<ggml_backend_dev_t *>(eng.devices[1].data());
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

} // namespace cospec
