// The draft's hidden state at a prompt's last token (prompt_embedding.h), in a small context of
// its own: the draft's generation context keeps its cache, and pooling needs embeddings on.
#include "prompt_embedding.h"

#include "block_sources.h"
#include "engine.h"
#include "internal.h"
#include "text_bridge.h"

#include <cmath>
#include <string>

namespace cospec {

prompt_embedder::~prompt_embedder() {
    if (ctx != nullptr) {
        llama_batch_free(batch);
        llama_free(ctx);
    }
}

int32_t prompt_embedder::embed(cospec_engine & e, const llama_token * prompt, int32_t n_prompt, std::vector<float> & out) {
    if (!e.has_draft) {
        return fail(COSPEC_ERR_NO_DRAFT, "a prompt embedding is the draft model's, but the engine has no draft");
    }
    if (n_prompt < 0 || (prompt == nullptr && n_prompt > 0)) {
        return fail(COSPEC_ERR_INVALID_ARGUMENT, "prompt embedding: a prompt is needed");
    }
    for (int32_t i = 0; i < n_prompt; ++i) {
        if (prompt[i] < 0 || prompt[i] >= e.target.n_vocab) {
            return fail(COSPEC_ERR_INVALID_ARGUMENT, "prompt embedding: token " + std::to_string(prompt[i]) +
                                                         " is outside the target's vocabulary");
        }
    }
    // The draft's own tokens of the prompt's text where its vocabulary differs (as it drafts).
    std::vector<llama_token> tokens(prompt, prompt + n_prompt);
    if (!e.vocab_difference.empty()) {
        tokens = draft_prompt(e, cospec_generate_default_params(), prompt, n_prompt);
    }
    if (tokens.size() > (size_t) PROMPT_EMBEDDING_TOKENS) {
        tokens.erase(tokens.begin(), tokens.end() - PROMPT_EMBEDDING_TOKENS);
    }
    const int32_t n_embd = llama_model_n_embd(e.draft.model);
    out.assign((size_t) n_embd, 0.0f);
    if (tokens.empty()) {
        return COSPEC_OK; // nothing to read: the zero vector, the same every time
    }
    if (ctx == nullptr) {
        llama_context_params cp = llama_context_default_params();
        cp.n_ctx = (uint32_t) PROMPT_EMBEDDING_TOKENS;
        cp.n_batch = (uint32_t) PROMPT_EMBEDDING_TOKENS;
        cp.n_ubatch = (uint32_t) PROMPT_EMBEDDING_TOKENS;
        cp.n_seq_max = 1;
        cp.n_threads = e.n_threads;
        cp.n_threads_batch = e.n_threads_batch > 0 ? e.n_threads_batch : e.n_threads;
        cp.no_perf = true;
        cp.swa_full = true;
        cp.embeddings = true;
        cp.pooling_type = LLAMA_POOLING_TYPE_LAST;
        cp.type_k = e.cache_type_k[1];
        cp.type_v = e.cache_type_v[1];
        cp.abort_callback = [](void * data) { return static_cast<std::atomic<bool> *>(data)->load(); };
        cp.abort_callback_data = &e.abort_flag;
        ctx = llama_init_from_model(e.draft.model, cp);
        if (ctx == nullptr) {
            return fail(COSPEC_ERR_ARBITER, "could not create the draft context that reads prompts for the arbiter's gate");
        }
        batch = llama_batch_init(PROMPT_EMBEDDING_TOKENS, 0, 1);
    }
    llama_memory_clear(llama_get_memory(ctx), true);
    batch.n_tokens = (int32_t) tokens.size();
    for (int32_t i = 0; i < batch.n_tokens; ++i) {
        batch.token[i] = tokens[(size_t) i];
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = true; // (llama.cpp pools over the batch's outputs)
    }
    if (const int32_t ret = llama_decode(ctx, batch); ret != 0) {
        return fail(ret == 2 ? COSPEC_ERR_CANCELLED : COSPEC_ERR_DECODE,
                    "the draft could not read the prompt for the arbiter's gate (llama_decode returned " +
                        std::to_string(ret) + ")");
    }
    const float * pooled = llama_get_embeddings_seq(ctx, 0);
    if (pooled == nullptr) {
        return fail(COSPEC_ERR_ARBITER, "llama.cpp returned no pooled hidden state of the prompt");
    }
    double norm = 0.0;
    for (int32_t i = 0; i < n_embd; ++i) {
        norm += (double) pooled[i] * pooled[i];
    }
    if (!std::isfinite(norm)) {
        return fail(COSPEC_ERR_ARBITER, "the draft's hidden state of the prompt is not finite");
    }
    const double scale = norm > 0.0 ? 1.0 / std::sqrt(norm) : 0.0;
    for (int32_t i = 0; i < n_embd; ++i) {
        out[(size_t) i] = (float) (pooled[i] * scale);
    }
    return COSPEC_OK;
}

} // namespace cospec

extern "C" int32_t cospec_prompt_embedding(cospec_engine * engine, const cospec_token * prompt, int32_t n_prompt, float * out,
                                           size_t out_size) {
    cospec::clear_error();
    if (engine == nullptr || out == nullptr) {
        return cospec::fail(COSPEC_ERR_INVALID_ARGUMENT, "cospec_prompt_embedding: engine and out are required");
    }
    if (!engine->has_draft) {
        return cospec::fail(COSPEC_ERR_NO_DRAFT, "a prompt embedding is the draft model's, but the engine has no draft");
    }
    const int32_t n_embd = llama_model_n_embd(engine->draft.model);
    if (out_size < (size_t) n_embd) {
        return cospec::fail(COSPEC_ERR_INVALID_ARGUMENT, "cospec_prompt_embedding: output has room for " + std::to_string(out_size) +
                                                     " floats, " + std::to_string(n_embd) + " needed");
    }
    std::unique_lock<std::mutex> lock(engine->busy, std::try_to_lock);
    if (!lock.owns_lock()) {
        return cospec::fail(COSPEC_ERR_INVALID_ARGUMENT, "another generation is already running on this engine");
    }
    engine->abort_flag.store(false);
    std::vector<float> v;
    if (const int32_t st = engine->embedder.embed(*engine, prompt, n_prompt, v); st != COSPEC_OK) {
        return st;
    }
    std::copy(v.begin(), v.end(), out);
    return n_embd;
}
