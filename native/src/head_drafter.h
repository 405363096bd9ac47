// Head drafters, which draft from the target's own hidden states: an EAGLE-3 head, a one-layer
// model of its own that reads three of the target's layers, the multi-token-prediction (MTP)
// layers some targets carry (Qwen3.5, Qwen3-Next), run in a second context on the target's own
// weights, and a DFlash drafter, whose cache holds the target's hidden states and which drafts a
// whole block from mask tokens in one pass. MTP and DFlash run through llama.cpp's
// common/speculative.cpp (libllama-common). EAGLE-3 follows
// llama.cpp's implementation step by step (its encoder, its decoder's input convention, its
// deferred boundary) but is driven here, because llama.cpp's drafts always as many tokens as the
// drafter was opened with and this engine's tuner picks each block's length.
// The head must hear every target decode, in order: `seen` is the text it has heard, position by
// position.
// A decode of tokens it already heard (a recurrent target catching up after restoring a saved
// state) is a replay it skips; anything else that breaks the order leaves it stale, and the
// target's cache starts over with it.
#pragma once

#include "llama.h"

#include <cstdint>
#include <string>
#include <vector>

struct common_speculative;
struct common_batch;

namespace cospec {

enum class head_kind { none, eagle3, mtp, dflash };

const char * head_kind_name(head_kind kind);

class head_drafter {
  public:
    head_drafter() = default;
    head_drafter(const head_drafter &) = delete;
    head_drafter & operator=(const head_drafter &) = delete;
    ~head_drafter() { close(); }
    // Free the drafter, its context and an EAGLE-3 head's model: no head from here.
    void close();

    // Open llama.cpp's drafter beside the target's context: with head_model an EAGLE-3 head or a
    // DFlash drafter (`kind`; loaded by the caller, freed here), else the target's own MTP layers.
    // base: the target context's parameters (threads, batch, flash attention). A status and
    // fail()'s message.
    int32_t open(llama_model * target_model, llama_context * target_ctx, llama_model * head_model, head_kind kind,
                 const llama_context_params & base);
    head_kind kind() const { return kind_; }
    bool ready() const { return spec != nullptr || (kind_ == head_kind::eagle3 && ctx != nullptr); }
    // The most tokens one draft call gives (DFlash: its trained block less the anchor; MTP: the
    // engine's cap on llama.cpp's fixed length); 0: as many as asked (EAGLE-3).
    int32_t draft_limit() const { return draft_limit_; }

    // Whether this call's target decodes are heard (a call that drafts with the head).
    bool listening = false;

    // Before the target decodes tokens[from..to) at those positions: where they differ from what
    // the head heard there, it is stale. The part it heard (a replay, up to n_seen()) goes in
    // batches of its own, so that none mixes replayed and new tokens.
    void check_replay(const std::vector<llama_token> & tokens, size_t from, size_t to);
    // The target decoded `batch` (sequence 0, positions in order): new tokens go to llama.cpp's
    // drafter, a replay is skipped, a batch that breaks the order makes the head stale.
    int32_t heard(const llama_batch & batch);
    // After a step: the target's cache holds the output's tokens up to n_valid (the rest of its
    // last batch was rejected); the head keeps the same.
    void kept(size_t n_valid);
    // The head cannot follow the target's cache any more: it starts over with it.
    bool stale() const { return stale_; }
    void mark_stale() { stale_ = true; }
    // Forget everything heard (the target's cache was emptied too).
    int32_t clear();
    // The target's cache is cut back to its first n tokens: the head forgets what it heard after
    // them, or goes stale where it cannot (MTP: llama.cpp's drafter cannot roll back).
    void truncate(size_t n);

    // Draft up to n_max tokens after seq[0..n_past] (seq[n_past], the step's first input, is not
    // decoded yet; the head has heard seq[0..n_past)). Tokens in the target's vocabulary.
    int32_t draft(const std::vector<llama_token> & seq, size_t n_past, int32_t n_max, std::vector<llama_token> & out);

    size_t n_seen() const { return seen.size(); }

  private:
    int32_t start_spec();
    void free_spec();
    int32_t prime();
    int32_t open_eagle3(llama_model * target_model);
    int32_t check_reads_target_layers(llama_model * target_model, const char * article, uint32_t n_wanted, int32_t max_id);
    int32_t check_dflash(llama_model * target_model);
    int32_t eagle3_heard(const llama_batch & batch);
    void eagle3_kept(size_t n_valid);
    int32_t eagle3_flush();
    int32_t eagle3_draft(llama_token first, int32_t n_max, std::vector<llama_token> & out);
    void eagle3_forget();

    head_kind kind_ = head_kind::none;
    int32_t draft_limit_ = 0;
    llama_model * own_model = nullptr; // an EAGLE-3 head's (MTP runs on the target's)
    llama_context * target_ctx = nullptr;
    llama_context * ctx = nullptr; // the drafter's context
    common_speculative * spec = nullptr;
    common_batch * mirror = nullptr; // the target's batch as llama.cpp's drafters read it
    std::vector<llama_token> seen;
    size_t last_batch_pos0 = 0;   // where the last batch the drafter processed began
    size_t last_batch_end = 0;    // and ended (0: none since the last kept())
    bool stale_ = false;
    bool primed = false; // the drafter drafted once since it started (llama.cpp's accept needs that)
    std::vector<llama_token> prefix; // scratch: the text before the step's first input

    // EAGLE-3. Its decoder's cache entry at position p reads (token p+1, g p), g being the
    // encoder's fusion of the target's three hidden states at p: the last heard position waits
    // for the next token (the "deferred boundary", pending_*), which the next batch or draft brings.
    std::vector<int32_t> layer_ids;   // the target layers it reads (n_layer: the final norm's input)
    int32_t n_layer_target = 0;
    int32_t n_embd_target = 0;
    int32_t n_embd_head = 0;
    int32_t n_vocab = 0;
    common_batch * enc_batch = nullptr; // fused hidden states in, g out
    common_batch * dec_batch = nullptr; // (token, g) pairs
    std::vector<llama_token> queued_tokens; // heard since the last draft, from position queued_pos0
    std::vector<float> queued_features;     // their fused hidden states, [rows, 3 * n_embd_target]
    size_t queued_pos0 = 0;
    std::vector<float> g_rows;    // scratch: the encoder's output for the queue, [rows, n_embd_head]
    // The g of the last positions the head ran, from position g_history_pos0: a cut back to one
    // of them makes it the deferred boundary again.
    std::vector<float> g_history;
    size_t g_history_pos0 = 0;
    llama_pos pending_pos = -1;   // the deferred boundary's position, -1: none
    std::vector<float> pending_g; // and its g
    std::vector<float> step_g;    // a draft step's output state, the next step's g
};

} // namespace cospec
