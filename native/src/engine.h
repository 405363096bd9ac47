// The engine's internal state, shared by engine.cpp and generate.cpp.
#pragma once

#include "draft_tuner.h"
#include "head_drafter.h"
#include "ngram_drafter.h"
#include "prompt_embedding.h"
#include "internal.h"
#include "llama.h"
#include "rpc.h"

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
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
    // A recurrent or hybrid model's memory cannot drop a tail (llama_memory_seq_rm fails): its
    // state is saved before tokens a rollback may take back, and restored instead of decoding
    // the whole context again. The recurrent part alone is saved (llama.cpp's partial state, the
    // same size at any context length); a hybrid's attention cache drops its tail as usual.
    bool tail_fixed = false;
    struct checkpoint {
        std::vector<uint8_t> state;
        size_t n_tokens = 0; // the state after cached[0..n_tokens)
        bool valid = false;
    } saved;
    std::string chat_template;
    bool has_chat_template = false;
    std::string desc;
    // What the context was created with (cospec_engine_flash_attn); an arbiter that reads
    // the draft's cache (learned_arbiter.cpp) needs a context laid out the same way.
    llama_flash_attn_type flash_attn = LLAMA_FLASH_ATTN_TYPE_DISABLED;

    // Empty the cache (and forget the checkpoint, which described its contents).
    void clear_cache() {
        llama_memory_clear(llama_get_memory(ctx), true);
        cached.clear();
        saved.valid = false;
    }

    model_slot() = default;
    model_slot(const model_slot &) = delete;
    model_slot & operator=(const model_slot &) = delete;
    ~model_slot();
};

struct cospec_engine {
    // The RPC servers of the target; first, so the models on them are freed before it lets go.
    cospec::rpc_connections rpc;
    // Declared early so it outlives the contexts whose abort callback reads it.
    std::atomic<bool> abort_flag {false};
    model_slot target;
    model_slot draft;
    bool has_draft = false;
    // The draft's reading of prompts for embedding gates (after the draft: it goes first).
    cospec::prompt_embedder embedder;
    // llama.cpp's head drafter, where the engine has one (declared after the target: its context
    // reads the target's and goes first). Its block lengths learn across calls as the draft's do.
    cospec::head_drafter head;
    cospec::draft_tuner head_tuner;
    // Where the draft's vocabulary is not the target's, how they differ: its proposals then go
    // to the target as text (text_bridge.h). Empty: the draft drafts the target's own tokens.
    std::string vocab_difference;
    int32_t n_ctx = 0;
    int32_t n_batch = 0;
    int32_t n_ubatch = 0;
    int32_t n_threads = 0;       // generation threads of the contexts (resolved, > 0)
    int32_t n_threads_batch = 0;
    std::string draft_path;
    // How the draft was loaded: a LoRA arbiter's folded copy of it is loaded the same way.
    int32_t draft_gpu_layers = 0;
    bool draft_extra_buffers = true;
    // Bytes of each model's weights llama.cpp repacked at load (0 target, 1 draft): private memory.
    int64_t repacked_bytes[2] = {0, 0};
    // llama.cpp's loading and cache settings, resolved once from cospec_engine_params, by model
    // (0 target, 1 draft): a LoRA arbiter's folded draft and its context take the draft's.
    llama_load_mode load_mode = LLAMA_LOAD_MODE_AUTO;
    std::vector<ggml_backend_dev_t> devices[2];  // empty: llama.cpp's choice; else null-terminated
    ggml_type cache_type_k[2] = {GGML_TYPE_F16, GGML_TYPE_F16};
    ggml_type cache_type_v[2] = {GGML_TYPE_F16, GGML_TYPE_F16};
    std::string draft_fingerprint; // computed on first use (learned arbiters check it)
    std::string draft_header;      // a hash of its metadata, read with it (a fold checks both)
    // Parameters of the draft over the target's: the draft step's cost in the
    // fixed cost model that arbiters which keep mismatches use (timing-free).
    double draft_cost_ratio = 0.0;
    mutable std::mutex busy; // one generation at a time per engine (arbiters reach it through a const pointer)
    // The thread running the generation that holds `busy`: a user arbiter's
    // callback on it may score with an arbiter that decodes on the draft (the
    // training side records blocks that way), other threads must wait.
    std::atomic<std::thread::id> generating {};
    // Acceptance and cost estimates of this draft/target pair, kept across calls.
    cospec::draft_tuner tuner;
    // The n-gram drafter's pool of every text this engine has seen (a chat's turns, a server's
    // requests) and its own acceptance estimate; the target's costs are the same measurements.
    cospec::ngram_drafter ngram;
    cospec::draft_tuner ngram_tuner;
    // The --draft-p-min its acceptance was learned under: blocks the draft
    // declines count as ended, so another p-min starts the estimate afresh.
    float tuner_draft_p_min = 0.0f;
    // The pair's calibration on this machine (cospec_engine_set_calibration), if one was given:
    // it seeded the tuners above and is the cost model of timing-free block lengths.
    cospec_calibration calibration {};
    bool calibrated = false;
};

namespace cospec {
// Marks the calling thread as the engine's generating one for a scope.
struct generating_thread {
    cospec_engine & e;
    explicit generating_thread(cospec_engine & engine) : e(engine) { e.generating.store(std::this_thread::get_id()); }
    ~generating_thread() { e.generating.store(std::thread::id()); }
};

// Put tokens[0..n) at positions pos0.. of sequence 0 into s.batch.
inline void fill_batch(model_slot & s, const llama_token * tokens, int32_t n, llama_pos pos0, bool all_logits) {
    llama_batch & b = s.batch;
    b.n_tokens = n;
    for (int32_t i = 0; i < n; ++i) {
        b.token[i] = tokens[i];
        b.pos[i] = pos0 + i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = all_logits;
    }
}
} // namespace cospec
