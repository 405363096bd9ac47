// The engine's internal state, shared by engine.cpp and generate.cpp.
#pragma once

#include "draft_tuner.h"
#include "internal.h"
#include "llama.h"

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

namespace cospec {
// Like llama.cpp: vocabularies may differ by a few padding tokens at the end.
constexpr int32_t MAX_VOCAB_SIZE_DIFFERENCE = 128;
}

// One model with its own context and KV cache.
struct model_slot {
    llama_model * model = nullptr;
    llama_context * ctx = nullptr;
    const llama_vocab * vocab = nullptr;
    int32_t n_vocab = 0;
    llama_batch batch {};
    // Tokens whose keys and values are in the cache, at positions 0..n-1.
    std::vector<llama_token> cached;
    std::string chat_template;
    bool has_chat_template = false;
    std::string desc;

    model_slot() = default;
    model_slot(const model_slot &) = delete;
    model_slot & operator=(const model_slot &) = delete;
    ~model_slot();
};

struct cospec_engine {
    // Declared first so it outlives the contexts whose abort callback reads it.
    std::atomic<bool> abort_flag {false};
    model_slot target;
    model_slot draft;
    bool has_draft = false;
    int32_t n_ctx = 0;
    int32_t n_batch = 0;
    std::mutex busy; // one generation at a time per engine
    // Acceptance and cost estimates of this draft/target pair, kept across calls.
    cospec::draft_tuner tuner;
};
