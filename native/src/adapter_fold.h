// Folding a LoRA arbiter's adapter into a private F32 copy of the draft's weights, where they are
// small: on a small draft the adapter's two extra products per projection cost more than the
// projection itself.
#pragma once

#include "arbiter_file.h"
#include "engine.h"

#include <map>
#include <memory>
#include <string>

namespace cospec {

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

// Plan the fold of the adapter at adapter_path into the engine's draft (false: nothing folded,
// the adapter applies at decode instead).
bool plan_fold(const cospec_engine & eng, const std::string & adapter_path, float lora_scale, fold_plan & plan);
// The folded draft, loaded like the draft (same devices); null where it cannot be made.
llama_model * load_folded(const fold_plan & plan, const cospec_engine & eng);

} // namespace cospec
