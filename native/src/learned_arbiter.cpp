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
#include "adapter_fold.h"
#include "arbiter_file.h"
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
#include <string>
#include <vector>

using cospec::fail;

namespace {

using namespace cospec;

// The region holds a draft and a target token per block position.
constexpr int32_t MAX_REGION = 2 * cospec::MAX_BLOCK_BATCH;

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
        return !gate_on || gate_value(prompt, n_prompt) >= (double) b.gate_threshold;
    }

    // What the gate compares with its threshold. An embedding gate reads the prompt with the draft;
    // where that fails, the arbiter abstains (-1: below every threshold), as on a prompt it refuses.
    double gate_value(const cospec_token * prompt, int32_t n_prompt) const {
        if (b.gate_embedding.empty()) {
            return gate_score(b, prompt, n_prompt);
        }
        std::vector<float> e;
        if (eng->embedder.embed(*eng, prompt, n_prompt, e) != COSPEC_OK || e.size() != b.gate_embedding.size()) {
            return -1.0;
        }
        double z = (double) b.gate_bias;
        for (size_t i = 0; i < e.size(); ++i) {
            z += (double) b.gate_embedding[i] * e[i];
        }
        return 1.0 / (1.0 + std::exp(-z));
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
            cp.type_k = eng->cache_type_k[1];
            cp.type_v = eng->cache_type_v[1];
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
        const int32_t nf = b.n_features;
        inputs.resize((size_t) k * c);
        if (b.kind == COSPEC_ARBITER_FEATURES) {
            for (int32_t i = 0; i < k; ++i) {
                std::copy_n(features.begin() + (size_t) i * COSPEC_N_FEATURES, nf, inputs.begin() + (size_t) i * c);
            }
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
            std::copy_n(features.begin() + (size_t) i * COSPEC_N_FEATURES, nf, row + 2 * d);
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
        const int32_t nf = a->b.n_features;
        const int32_t expected = a->b.kind == COSPEC_ARBITER_LORA ? 2 * a->b.n_embd + nf : nf;
        if (a->b.kind == COSPEC_ARBITER_LORA && a->b.n_embd != llama_model_n_embd(engine->draft.model)) {
            return fail(COSPEC_ERR_ARBITER, "arbiter '" + a->b.path + "' expects hidden states of width " +
                                                std::to_string(a->b.n_embd) + ", the draft has " +
                                                std::to_string(llama_model_n_embd(engine->draft.model)));
        }
        if (a->b.head.n_in() != expected) {
            return fail(COSPEC_ERR_ARBITER, "arbiter '" + a->b.path + "': the head reads " + std::to_string(a->b.head.n_in()) +
                                                " inputs, a " + kind_name + " arbiter gives " + std::to_string(expected));
        }
        if (!a->b.gate_embedding.empty() && (int64_t) a->b.gate_embedding.size() != llama_model_n_embd(engine->draft.model)) {
            return fail(COSPEC_ERR_ARBITER, "arbiter '" + a->b.path + "': its embedding gate reads hidden states of width " +
                                                std::to_string(a->b.gate_embedding.size()) + ", the draft has " +
                                                std::to_string(llama_model_n_embd(engine->draft.model)));
        }
        if (a->b.has_gate() && a->b.gate_embedding.empty() && a->b.gate_n_vocab != engine->target.n_vocab) {
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
    // (An embedding gate decodes on the draft: not beside a generation on its engine.)
    std::unique_lock<std::mutex> lock(a->eng->busy, std::try_to_lock);
    if (!lock.owns_lock()) {
        return (float) fail(COSPEC_ERR_INVALID_ARGUMENT, "another generation is already running on this engine");
    }
    a->eng->abort_flag.store(false);
    cospec::clear_error();
    const double v = a->gate_value(prompt, n_prompt);
    if (v < 0.0) {
        return (float) COSPEC_ERR_ARBITER; // the embedding's error is the last error
    }
    return (float) v;
}

bool cospec_arbiter_admits(const cospec_arbiter * arbiter, const cospec_token * prompt, int32_t n_prompt) {
    if (arbiter == nullptr || (prompt == nullptr && n_prompt > 0) || n_prompt < 0) {
        return false;
    }
    const auto * a = dynamic_cast<const learned_arbiter *>(arbiter);
    if (a == nullptr || a->b.gate_embedding.empty()) {
        return arbiter->admits(prompt, n_prompt);
    }
    std::unique_lock<std::mutex> lock(a->eng->busy, std::try_to_lock);
    if (!lock.owns_lock()) {
        return false; // (busy: what it would say is not known now; the generation asks it itself)
    }
    a->eng->abort_flag.store(false);
    return arbiter->admits(prompt, n_prompt);
}

} // extern "C"
