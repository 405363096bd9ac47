#include "head_drafter.h"

#include "internal.h"

// llama.cpp's common library (libllama-common, built and installed with the llama.cpp this
// engine links) and its staging API for the hidden states the heads read.
#include "common.h"
#include "llama-ext.h"
#include "speculative.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <string>

namespace cospec {

namespace {
constexpr int32_t MTP_DRAFT_MAX = 3;
// How many positions of g a head keeps for cuts back (a regenerated reply, another request on a
// shared prefix): 16 MiB for a 4096-wide head.
constexpr size_t G_HISTORY_ROWS = 1024;
} // namespace

const char * head_kind_name(head_kind kind) {
    switch (kind) {
        case head_kind::eagle3: return "eagle3";
        case head_kind::mtp:    return "mtp";
        case head_kind::dflash: return "dflash";
        default:                return "none";
    }
}

// Target architectures whose graphs expose the layer inputs an EAGLE-3 head reads (llama.cpp
// asserts, and so ends the process, where a graph does not: src/models/*.cpp set t_layer_inp).
static bool exposes_layer_inputs(const std::string & arch) {
    static const char * const known[] = {"llama",       "nanbeige",   "qwen3",    "qwen3moe",  "gemma4",
                                         "muse-glimmer", "deepseek4", "nemotron_h", "bailingmoe3", "hunyuan_vl",
                                         "gpt-oss",     "lfm2",       "minimax-01", "minimax-m2", "qwen3next",
                                         "qwen35",      "qwen35moe",  "qwen4exp", "mimo2"};
    return std::find(std::begin(known), std::end(known), arch) != std::end(known);
}

static std::string architecture(const llama_model * model) {
    char buf[128] = {0};
    return llama_model_meta_val_str(model, "general.architecture", buf, sizeof(buf)) > 0 ? std::string(buf) : std::string();
}

void head_drafter::close() {
    free_spec();
    delete mirror;
    mirror = nullptr;
    delete enc_batch;
    enc_batch = nullptr;
    delete dec_batch;
    dec_batch = nullptr;
    eagle3_forget();
    if (ctx != nullptr) {
        llama_free(ctx);
        ctx = nullptr;
    }
    if (own_model != nullptr) {
        llama_model_free(own_model);
        own_model = nullptr;
    }
    kind_ = head_kind::none;
    draft_limit_ = 0;
    seen.clear();
    stale_ = false;
    listening = false;
}

void head_drafter::free_spec() {
    if (spec != nullptr) {
        common_speculative_free(spec);
        spec = nullptr;
    }
}

int32_t head_drafter::open(llama_model * target_model, llama_context * target, llama_model * head_model, head_kind kind,
                           const llama_context_params & base) {
    own_model = head_model;
    target_ctx = target;
    kind_ = head_model != nullptr ? kind : head_kind::mtp;
    if (kind_ == head_kind::dflash) {
        if (const int32_t st = check_dflash(target_model); st != COSPEC_OK) {
            return st;
        }
    } else if (kind_ == head_kind::eagle3) {
        // Exactly three layers, the last of which may be the final norm's input (id n_layer).
        if (const int32_t st = check_reads_target_layers(target_model, "an", 3, llama_model_n_layer(target_model));
            st != COSPEC_OK) {
            return st;
        }
    } else if (llama_model_n_layer_nextn(target_model) <= 0) {
        return fail(COSPEC_ERR_INVALID_ARGUMENT, "the target carries no multi-token-prediction layers");
    }
    // As llama.cpp's common_speculative_init_from_params makes the draft context: as long as the
    // target's, one output at a time, reading the target's context (ctx_other).
    llama_context_params cp = base;
    cp.n_outputs_max = 1;
    cp.n_outputs_max_per_seq = 1;
    if (kind_ == head_kind::dflash) {
        // Its block, the anchor and the masks after it, is one non-causal batch: llama.cpp asserts
        // where the batch or the physical batch (-b, -ub) is shorter.
        cp.n_batch = std::max<uint32_t>(cp.n_batch, (uint32_t) draft_limit_ + 1);
        cp.n_ubatch = std::max<uint32_t>(cp.n_ubatch, (uint32_t) draft_limit_ + 1);
    }
    cp.n_rs_seq = 0;
    cp.ctx_other = target;
    cp.embeddings = false;
    if (kind_ == head_kind::mtp) {
        cp.ctx_type = LLAMA_CONTEXT_TYPE_MTP;
        draft_limit_ = MTP_DRAFT_MAX;
    }
    ctx = llama_init_from_model(head_model != nullptr ? head_model : target_model, cp);
    if (ctx == nullptr) {
        std::string why = take_llama_errors();
        return fail(COSPEC_ERR_MODEL_LOAD, std::string("could not create the ") + head_kind_name(kind_) +
                                               " drafter's context" + (why.empty() ? "" : ": " + why));
    }
    if (kind_ == head_kind::eagle3) {
        return open_eagle3(target_model);
    }
    mirror = new common_batch(target);
    return start_spec();
}

// What llama.cpp's drafters that read the target's layer inputs (EAGLE-3, DFlash) take on trust,
// checked: the target's graph keeps those inputs (else llama.cpp aborts), the drafter names
// n_wanted layers (0: any number but none), each at most max_id, and the target's vocabulary is
// its own. article: "a" or "an" before the drafter's name.
int32_t head_drafter::check_reads_target_layers(llama_model * target_model, const char * article, uint32_t n_wanted,
                                                int32_t max_id) {
    const std::string name = kind_ == head_kind::dflash ? "DFlash drafter" : "EAGLE-3 head";
    const std::string arch = architecture(target_model);
    if (!exposes_layer_inputs(arch)) {
        return fail(COSPEC_ERR_INVALID_ARGUMENT, std::string(article) + " " + name + " reads the target's layer inputs, "
                                                     "which llama.cpp's " + arch + " graph does not expose");
    }
    const uint32_t n_ids = llama_model_target_layer_ids_n(own_model);
    const int32_t * ids = llama_model_target_layer_ids(own_model);
    if (ids == nullptr || n_ids == 0 || (n_wanted > 0 && n_ids != n_wanted)) {
        return fail(COSPEC_ERR_MODEL_LOAD, n_wanted > 0 ? "the " + name + " names " + std::to_string(n_ids) +
                                                              " target layers to read, not " + std::to_string(n_wanted)
                                                        : "the " + name + " names no target layers to read");
    }
    for (uint32_t i = 0; i < n_ids; ++i) {
        if (ids[i] < 0 || ids[i] > max_id) {
            return fail(COSPEC_ERR_MODEL_LOAD, "the " + name + " reads target layer " + std::to_string(ids[i]) +
                                                   ", but the target has " + std::to_string(llama_model_n_layer(target_model)));
        }
    }
    if (llama_vocab_n_tokens(llama_model_get_vocab(own_model)) != llama_vocab_n_tokens(llama_model_get_vocab(target_model))) {
        return fail(COSPEC_ERR_VOCAB_MISMATCH, "the " + name + "'s vocabulary is not the target's");
    }
    return COSPEC_OK;
}

// And what llama.cpp's DFlash drafter takes on trust besides: each layer it reads is one of the
// target's (it has no final-norm case), its hidden states are as wide as its own (it concatenates
// them into its fc's input), and it has the mask token its block is made of.
int32_t head_drafter::check_dflash(llama_model * target_model) {
    if (const int32_t st = check_reads_target_layers(target_model, "a", 0, llama_model_n_layer(target_model) - 1);
        st != COSPEC_OK) {
        return st;
    }
    if (llama_model_n_embd(own_model) != llama_model_n_embd(target_model)) {
        return fail(COSPEC_ERR_MODEL_LOAD, "the DFlash drafter is " + std::to_string(llama_model_n_embd(own_model)) +
                                               " wide, the target's hidden states " +
                                               std::to_string(llama_model_n_embd(target_model)) +
                                               ": a drafter made for another target");
    }
    const llama_vocab * vocab = llama_model_get_vocab(own_model);
    const llama_token mask = llama_vocab_mask(vocab);
    if (mask < 0 || mask >= llama_vocab_n_tokens(vocab)) {
        return fail(COSPEC_ERR_MODEL_LOAD, "the DFlash drafter has no mask token (tokenizer.ggml.mask_token_id) to "
                                           "draft from");
    }
    char buf[32] = {0};
    int32_t block = 16; // llama.cpp's default where the file does not say
    if (llama_model_meta_val_str(own_model, "dflash.block_size", buf, sizeof(buf)) > 0) {
        block = std::atoi(buf);
    }
    if (block < 2 || block > 256) {
        return fail(COSPEC_ERR_MODEL_LOAD, "the DFlash drafter's block of " + std::to_string(block) +
                                               " tokens is out of range (2 to 256)");
    }
    draft_limit_ = block - 1;
    return COSPEC_OK;
}

int32_t head_drafter::open_eagle3(llama_model * target_model) {
    const uint32_t n_ids = llama_model_target_layer_ids_n(own_model);
    const int32_t * ids = llama_model_target_layer_ids(own_model);
    layer_ids.assign(ids, ids + n_ids);
    n_layer_target = llama_model_n_layer(target_model);
    n_embd_target = llama_model_n_embd(target_model);
    n_embd_head = llama_model_n_embd(own_model);
    n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(target_model));
    // The target keeps the inputs of the layers the head reads (the final norm's for id n_layer).
    for (const int32_t id : layer_ids) {
        if (id < n_layer_target) {
            llama_set_embeddings_layer_inp(target_ctx, (uint32_t) id, true);
        } else {
            llama_set_embeddings_nextn(target_ctx, true, /*masked*/ false);
        }
    }
    // The head's own output state before its norm: the encoder's g, and a draft step's next g.
    llama_set_embeddings_nextn(ctx, true, /*masked*/ true);
    enc_batch = new common_batch(ctx);
    dec_batch = new common_batch(ctx);
    pending_g.assign((size_t) n_embd_head, 0.0f);
    return COSPEC_OK;
}

void head_drafter::eagle3_forget() {
    g_rows.clear();
    queued_tokens.clear();
    queued_features.clear();
    queued_pos0 = 0;
    g_history.clear();
    g_history_pos0 = 0;
    pending_pos = -1;
}

int32_t head_drafter::start_spec() {
    free_spec();
    primed = false;
    common_params_speculative sp;
    sp.types = {kind_ == head_kind::dflash ? COMMON_SPECULATIVE_TYPE_DRAFT_DFLASH : COMMON_SPECULATIVE_TYPE_DRAFT_MTP};
    // llama.cpp's MTP drafter always drafts n_max tokens (the engine's tuner can only cut the
    // block after), reusing a one-layer head past the depth it was trained for: a short cap
    // bounds what a block the tuner wanted short costs. DFlash drafts its whole block in one
    // pass, whatever of it is used.
    sp.draft.n_max = kind_ == head_kind::dflash ? draft_limit_ : MTP_DRAFT_MAX;
    sp.draft.n_min = 0;
    sp.draft.p_min = 0.0f;
    sp.draft.backend_sampling = false; // its top-1 on the CPU: no sampler in the draft's graph
    sp.draft.ctx_tgt = target_ctx;
    sp.draft.ctx_dft = ctx;
    try {
        spec = common_speculative_init(sp, 1);
    } catch (const std::exception & ex) {
        return fail(COSPEC_ERR_MODEL_LOAD, std::string("llama.cpp's ") + head_kind_name(kind_) + " drafter refused: " + ex.what());
    }
    if (spec == nullptr) {
        return fail(COSPEC_ERR_MODEL_LOAD, std::string("llama.cpp's ") + head_kind_name(kind_) + " drafter did not start");
    }
    return COSPEC_OK;
}

void head_drafter::check_replay(const std::vector<llama_token> & tokens, size_t from, size_t to) {
    for (size_t i = from; i < std::min(to, seen.size()); ++i) {
        if (tokens[i] != seen[i]) {
            stale_ = true;
            return;
        }
    }
}

int32_t head_drafter::heard(const llama_batch & batch) {
    if (!ready() || stale_ || batch.n_tokens <= 0) {
        return COSPEC_OK;
    }
    const size_t pos0 = (size_t) batch.pos[0];
    const size_t n = (size_t) batch.n_tokens;
    if (pos0 + n <= seen.size()) {
        for (size_t i = 0; i < n; ++i) {
            if (batch.token[i] != seen[pos0 + i]) {
                stale_ = true;
                return COSPEC_OK;
            }
        }
        return COSPEC_OK; // a replay: the head heard these tokens, in this order, already
    }
    if (pos0 != seen.size()) {
        stale_ = true; // a gap, or a batch mixing heard and new tokens
        return COSPEC_OK;
    }
    if (kind_ == head_kind::eagle3) {
        if (const int32_t status = eagle3_heard(batch); status != COSPEC_OK || stale_) {
            return status;
        }
        seen.insert(seen.end(), batch.token, batch.token + n);
        last_batch_pos0 = pos0;
        last_batch_end = pos0 + n;
        return COSPEC_OK;
    }
    mirror->clear();
    for (size_t i = 0; i < n; ++i) {
        mirror->add(batch.token[i], batch.pos[i], 0, batch.logits[i] != 0);
    }
    bool ok = false;
    try {
        ok = common_speculative_process(spec, *mirror);
    } catch (const std::exception & ex) {
        return fail(COSPEC_ERR_DECODE, std::string("the ") + head_kind_name(kind_) + " drafter failed: " + ex.what());
    }
    if (!ok) {
        stale_ = true; // its context could not take the batch: it starts over with the target's cache
        return COSPEC_OK;
    }
    seen.insert(seen.end(), batch.token, batch.token + n);
    last_batch_pos0 = pos0;
    last_batch_end = pos0 + n;
    // (DFlash's accept does nothing: it needs no draft before it)
    return primed || kind_ == head_kind::dflash ? COSPEC_OK : prime();
}

// llama.cpp's accept() goes to the drafter that drafted last, and asserts where none has: a
// drafter that has only heard blocks of other sources (the n-gram drafter's, the draft model's)
// could not be told which of their rows stood. One throwaway draft token after its first batch
// makes it the one that drafted; what that draft wrote to its cache is dropped again, so the
// drafter is as it was (EAGLE-3's pending boundary position is rewritten by its next decode).
int32_t head_drafter::prime() {
    std::vector<llama_token> scratch;
    prefix.assign(seen.begin(), seen.end() - 1);
    const size_t pos0 = seen.size();
    common_speculative_get_draft_params(spec, 0) = {true, 1, (llama_pos) pos0, seen.back(), &prefix, &scratch};
    try {
        common_speculative_draft(spec);
    } catch (const std::exception & ex) {
        return fail(COSPEC_ERR_DECODE, std::string("the ") + head_kind_name(kind_) + " drafter failed: " + ex.what());
    }
    // EAGLE-3 drafts from its deferred boundary, one position before the text's end.
    const size_t keep = kind_ == head_kind::eagle3 ? pos0 - 1 : pos0;
    llama_memory_seq_rm(llama_get_memory(ctx), 0, (llama_pos) keep, -1);
    primed = !scratch.empty();
    return COSPEC_OK;
}

void head_drafter::kept(size_t n_valid) {
    if (!ready() || stale_) {
        last_batch_end = 0;
        return;
    }
    if (last_batch_end == 0) {
        if (n_valid < seen.size()) {
            stale_ = true; // the output left text the head heard before this step
        }
        return;
    }
    n_valid = std::min(n_valid, last_batch_end);
    if (n_valid <= last_batch_pos0) {
        stale_ = true; // rows before the last batch were rejected: its state no longer fits
        last_batch_end = 0;
        return;
    }
    if (kind_ == head_kind::eagle3) {
        eagle3_kept(n_valid);
        seen.resize(n_valid);
        last_batch_end = 0;
        return;
    }
    // llama.cpp's accept: the last batch's first rows stand (its first input and the draft
    // tokens the target took after it), the rest are dropped from the head's cache too. It
    // asserts where the drafter has not drafted (a priming draft that found no room, near the
    // context's end), and DFlash's does nothing.
    if (primed && kind_ != head_kind::dflash) {
        common_speculative_accept(spec, 0, (uint16_t) std::min<size_t>(n_valid - last_batch_pos0 - 1, UINT16_MAX));
    }
    llama_memory_seq_rm(llama_get_memory(ctx), 0, (llama_pos) n_valid, -1);
    seen.resize(n_valid);
    last_batch_end = 0;
}

void head_drafter::truncate(size_t n) {
    if (!ready() || stale_ || n >= seen.size()) {
        return;
    }
    if (kind_ == head_kind::dflash && n > 0) {
        // Its state is its cache of the target's hidden states, position by position.
        seen.resize(n);
        last_batch_end = 0;
        llama_memory_seq_rm(llama_get_memory(ctx), 0, (llama_pos) n, -1);
        return;
    }
    if (kind_ != head_kind::eagle3 || n == 0) {
        stale_ = true;
        return;
    }
    seen.resize(n);
    last_batch_end = 0;
    if (!queued_tokens.empty() && n > queued_pos0) {
        eagle3_kept(n); // the cut falls in what it has not run yet
        return;
    }
    // The cut falls in what it ran: position n - 1 becomes the deferred boundary again.
    queued_tokens.clear();
    queued_features.clear();
    if (n - 1 < g_history_pos0 || (n - g_history_pos0) * (size_t) n_embd_head > g_history.size()) {
        stale_ = true; // further back than it keeps
        return;
    }
    pending_pos = (llama_pos) (n - 1);
    std::memcpy(pending_g.data(), g_history.data() + (n - 1 - g_history_pos0) * (size_t) n_embd_head,
                (size_t) n_embd_head * sizeof(float));
    g_history.resize((n - g_history_pos0) * (size_t) n_embd_head);
    llama_memory_seq_rm(llama_get_memory(ctx), 0, pending_pos, -1);
}

int32_t head_drafter::clear() {
    seen.clear();
    last_batch_pos0 = last_batch_end = 0;
    stale_ = false;
    primed = false;
    eagle3_forget();
    if (ctx != nullptr) {
        llama_memory_clear(llama_get_memory(ctx), true);
    }
    // A fresh drafter: its carried-over hidden states described the text just forgotten.
    return spec != nullptr ? start_spec() : COSPEC_OK;
}

int32_t head_drafter::draft(const std::vector<llama_token> & seq, size_t n_past, int32_t n_max,
                            std::vector<llama_token> & out) {
    out.clear();
    if (!ready() || stale_ || n_max <= 0 || seen.size() != n_past) {
        return COSPEC_OK;
    }
    if (kind_ == head_kind::eagle3) {
        return eagle3_draft(seq[n_past], n_max, out);
    }
    prefix.assign(seq.begin(), seq.begin() + (std::ptrdiff_t) n_past);
    common_speculative_get_draft_params(spec, 0) = {
        /* .drafting = */ true,
        /* .n_max    = */ n_max,
        /* .pos0     = */ (llama_pos) n_past,
        /* .id_last  = */ seq[n_past],
        /* .prompt   = */ &prefix,
        /* .result   = */ &out,
    };
    try {
        common_speculative_draft(spec);
    } catch (const std::exception & ex) {
        out.clear();
        return fail(COSPEC_ERR_DECODE, std::string("the ") + head_kind_name(kind_) + " drafter failed: " + ex.what());
    }
    // Its own decodes past the text go: the target's verify batch is what it hears next.
    llama_memory_seq_rm(llama_get_memory(ctx), 0, (llama_pos) n_past, -1);
    if ((int32_t) out.size() > n_max) {
        out.resize((size_t) n_max);
    }
    return COSPEC_OK;
}

// ------------------------------------------------------------ EAGLE-3, after llama.cpp's
// common_speculative_impl_draft_eagle3

// What the target decoded is queued, its hidden states copied out, and run through the head at
// its next draft: a plain target step then costs the head nothing but the copy, where running
// the head's encoder and decoder on every step (two llama.cpp calls) cost a 135M target 10%.
int32_t head_drafter::eagle3_heard(const llama_batch & batch) {
    const int32_t n = batch.n_tokens;
    const size_t n_enc = layer_ids.size() * (size_t) n_embd_target;
    if (queued_tokens.empty()) {
        queued_pos0 = (size_t) batch.pos[0];
    } else if (queued_pos0 + queued_tokens.size() != (size_t) batch.pos[0]) {
        stale_ = true; // the order broke (heard() checks it first: this would be a bug)
        return COSPEC_OK;
    }
    const size_t row0 = queued_tokens.size();
    queued_features.resize((row0 + (size_t) n) * n_enc);
    for (size_t k = 0; k < layer_ids.size(); ++k) {
        const float * layer = layer_ids[k] < n_layer_target ? llama_get_embeddings_layer_inp(target_ctx, (uint32_t) layer_ids[k])
                                                            : llama_get_embeddings_nextn(target_ctx);
        if (layer == nullptr) {
            return fail(COSPEC_ERR_DECODE, "the target did not keep layer " + std::to_string(layer_ids[k]) +
                                               "'s hidden states for the EAGLE-3 head");
        }
        for (int32_t i = 0; i < n; ++i) {
            std::memcpy(queued_features.data() + (row0 + (size_t) i) * n_enc + k * (size_t) n_embd_target,
                        layer + (size_t) i * n_embd_target, (size_t) n_embd_target * sizeof(float));
        }
    }
    queued_tokens.insert(queued_tokens.end(), batch.token, batch.token + n);
    return COSPEC_OK;
}

void head_drafter::eagle3_kept(size_t n_valid) {
    // Rows past n_valid were rejected: they leave the queue (the head has not run them yet).
    if (n_valid < queued_pos0 + 1) {
        stale_ = true; // rows the head ran already were rejected (a draft always follows the queue's end)
        return;
    }
    const size_t keep = std::min(queued_tokens.size(), n_valid - queued_pos0);
    queued_tokens.resize(keep);
    queued_features.resize(keep * layer_ids.size() * (size_t) n_embd_target);
}

// Run the queue through the head: the encoder (one g per token; its positions are placeholders,
// it attends nowhere), then the decoder, which at position p takes (token p+1, g p). The pending
// boundary takes the queue's first token where a draft did not write it already; the queue's last
// row is the new one.
int32_t head_drafter::eagle3_flush() {
    const int32_t n = (int32_t) queued_tokens.size();
    if (n == 0) {
        return COSPEC_OK;
    }
    const size_t n_enc = layer_ids.size() * (size_t) n_embd_target;
    g_rows.resize((size_t) n * n_embd_head);
    const int32_t n_ubatch = (int32_t) llama_n_ubatch(ctx);
    for (int32_t i = 0; i < n; i += n_ubatch) {
        const int32_t n_chunk = std::min(n_ubatch, n - i);
        enc_batch->clear();
        llama_pos pos = llama_memory_seq_pos_max(llama_get_memory(ctx), 0) + 1;
        for (int32_t j = 0; j < n_chunk; ++j) {
            enc_batch->add_embd({queued_features.data() + (size_t) (i + j) * n_enc, 1, n_enc}, &pos, 0, true);
            ++pos;
        }
        if (llama_process(ctx, LLAMA_PROCESS_TYPE_ENCODE, enc_batch->get()) != 0) {
            stale_ = true;
            return COSPEC_OK;
        }
        const float * g = llama_get_embeddings_nextn(ctx);
        if (g == nullptr) {
            return fail(COSPEC_ERR_DECODE, "the EAGLE-3 head's encoder gave no output");
        }
        std::memcpy(g_rows.data() + (size_t) i * n_embd_head, g, (size_t) n_chunk * n_embd_head * sizeof(float));
    }
    const llama_pos pos0 = (llama_pos) queued_pos0;
    const int32_t n_batch = (int32_t) llama_n_batch(ctx);
    dec_batch->clear();
    if (pending_pos >= 0 && pending_pos + 1 == pos0 && pending_pos > llama_memory_seq_pos_max(llama_get_memory(ctx), 0)) {
        const int32_t idx = dec_batch->add(queued_tokens[0], pending_pos, 0, false);
        dec_batch->set_embd(idx, {pending_g.data(), 1, (size_t) n_embd_head});
    }
    for (int32_t k = 0; k + 1 < n; ++k) {
        const int32_t idx = dec_batch->add(queued_tokens[(size_t) k + 1], pos0 + k, 0, false);
        dec_batch->set_embd(idx, {g_rows.data() + (size_t) k * n_embd_head, 1, (size_t) n_embd_head});
        if (dec_batch->size() == n_batch) { // a long prompt: in batches the context takes
            if (llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, dec_batch->get()) != 0) {
                stale_ = true;
                return COSPEC_OK;
            }
            dec_batch->clear();
        }
    }
    pending_pos = pos0 + n - 1;
    std::memcpy(pending_g.data(), g_rows.data() + (size_t) (n - 1) * n_embd_head, (size_t) n_embd_head * sizeof(float));
    g_history.insert(g_history.end(), g_rows.begin(), g_rows.begin() + (std::ptrdiff_t) n * n_embd_head);
    const size_t rows = g_history.size() / (size_t) n_embd_head;
    if (rows > 2 * G_HISTORY_ROWS) { // keep the last G_HISTORY_ROWS (amortised: a copy every G_HISTORY_ROWS rows)
        const size_t drop = rows - G_HISTORY_ROWS;
        g_history.erase(g_history.begin(), g_history.begin() + (std::ptrdiff_t) (drop * (size_t) n_embd_head));
        g_history_pos0 += drop;
    }
    queued_tokens.clear();
    queued_features.clear();
    if (dec_batch->size() > 0 && llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, dec_batch->get()) != 0) {
        stale_ = true; // its context could not take the batch: it starts over with the target's cache
    }
    return COSPEC_OK;
}

int32_t head_drafter::eagle3_draft(llama_token first, int32_t n_max, std::vector<llama_token> & out) {
    if (const int32_t status = eagle3_flush(); status != COSPEC_OK || stale_) {
        return status;
    }
    if (pending_pos < 0) {
        return COSPEC_OK;
    }
    // The boundary's pair, completed by the step's first input, then one token at a time: each
    // step's output state is the next step's g.
    llama_memory_seq_rm(llama_get_memory(ctx), 0, pending_pos, -1);
    step_g = pending_g;
    llama_token token = first;
    for (int32_t i = 0; i < n_max; ++i) {
        dec_batch->clear();
        const int32_t idx = dec_batch->add(token, pending_pos + i, 0, true);
        dec_batch->set_embd(idx, {step_g.data(), 1, (size_t) n_embd_head});
        if (llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, dec_batch->get()) != 0) {
            break; // what it drafted so far stands as a block
        }
        const float * logits = llama_get_logits_ith(ctx, 0);
        const float * state = llama_get_embeddings_nextn_ith(ctx, 0);
        if (logits == nullptr || state == nullptr) {
            break;
        }
        token = (llama_token) (std::max_element(logits, logits + n_vocab) - logits);
        out.push_back(token);
        std::memcpy(step_g.data(), state, (size_t) n_embd_head * sizeof(float));
    }
    // The boundary's entry stands (the step's first input is the target's); the draft's go.
    llama_memory_seq_rm(llama_get_memory(ctx), 0, pending_pos + 1, -1);
    return COSPEC_OK;
}

} // namespace cospec
