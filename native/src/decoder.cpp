#include "decoder.h"

#include <algorithm>
#include <string>

namespace cospec {

int32_t nonfinite_logits() {
    return fail(COSPEC_ERR_DECODE, "the model computed non-finite logits (corrupt weights or metadata?)");
}

int32_t decoder::decode(model_slot & s, double & t_acc, llama_pos pos0) {
    const auto t0 = clock_type::now();
    const int32_t ret = llama_decode(s.ctx, s.batch);
    if (ret == 0) {
        llama_synchronize(s.ctx);
    }
    t_acc += ms_since(t0);
    (&s == &e.target ? st.n_target_decoded : st.n_draft_decoded) += s.batch.n_tokens;
    if (ret == 0) {
        if (&s == &e.target && e.head.ready()) {
            // The head drafts from the target's hidden states: it hears each of its decodes in a
            // call that drafts with it; any other decode leaves it behind the target's cache.
            if (!e.head.listening) {
                e.head.mark_stale();
            } else if (const int32_t status = e.head.heard(s.batch); status != COSPEC_OK) {
                return status;
            }
        }
        return COSPEC_OK;
    }
    if (!llama_memory_seq_rm(llama_get_memory(s.ctx), 0, pos0, -1)) {
        s.clear_cache(); // a memory that cannot drop the failed batch's part starts over
    }
    s.cached.resize(std::min(s.cached.size(), (size_t) pos0));
    if (ret == 2 || e.abort_flag.load()) {
        stop = COSPEC_STOP_ABORTED;
        return COSPEC_OK;
    }
    if (ret == 1) {
        return fail(COSPEC_ERR_CONTEXT_FULL, "the KV cache has no room for " + std::to_string(s.batch.n_tokens) +
                                                 " more tokens at position " + std::to_string(pos0));
    }
    return fail(COSPEC_ERR_DECODE, "llama_decode failed with code " + std::to_string(ret));
}

int32_t decoder::sync_to(model_slot & s, const std::vector<llama_token> & tokens, size_t n, bool want_logits,
                         double & t_acc, size_t * n_reused) {
    size_t keep_n = 0;
    const size_t limit = std::min(n, s.cached.size());
    while (keep_n < limit && s.cached[keep_n] == tokens[keep_n]) {
        keep_n += 1;
    }
    if (want_logits && keep_n == n && n > 0) {
        keep_n = n - 1;
    }
    const bool heard = &s == &e.target && e.head.ready() && e.head.listening;
    if (heard) {
        e.head.check_replay(tokens, keep_n, n);
        // What it heard past this text (an earlier reply on the same prompt) goes.
        e.head.truncate(n);
    }
    if (heard && e.head.stale()) {
        // The head cannot follow this cache (another call decoded on it, or the text it heard
        // differs from what comes): both start over from the first token.
        s.clear_cache();
        keep_n = 0;
        if (const int32_t status = e.head.clear(); status != COSPEC_OK) {
            return status;
        }
    }
    if (keep_n < s.cached.size()) {
        if (llama_memory_seq_rm(llama_get_memory(s.ctx), 0, (llama_pos) keep_n, -1)) {
            s.cached.resize(keep_n);
        } else if (restore(s, keep_n)) {
            keep_n = s.cached.size();
        } else {
            // A memory that cannot drop a tail and has no saved state below it: start over.
            s.clear_cache();
            keep_n = 0;
        }
    }
    if (s.saved.valid && s.saved.n_tokens > s.cached.size()) {
        s.saved.valid = false; // it described tokens the cache no longer holds
    }
    if (n_reused != nullptr) {
        *n_reused = keep_n;
    }
    while (keep_n < n) {
        size_t end = std::min(keep_n + (size_t) e.n_batch, n);
        if (heard && keep_n < e.head.n_seen()) {
            // A recurrent target restored from a saved state decodes text the head heard again
            // (checked above): that part goes in batches of its own, which the head skips.
            end = std::min(end, e.head.n_seen());
        }
        const int32_t chunk = (int32_t) (end - keep_n);
        fill_batch(s, tokens.data() + keep_n, chunk, (llama_pos) keep_n, false);
        s.batch.logits[chunk - 1] = want_logits && keep_n + chunk == n;
        if (const int32_t status = decode(s, t_acc, (llama_pos) keep_n); status != COSPEC_OK || stopped()) {
            return status;
        }
        s.cached.insert(s.cached.end(), tokens.begin() + keep_n, tokens.begin() + keep_n + chunk);
        keep_n += chunk;
    }
    return COSPEC_OK;
}

void decoder::checkpoint(model_slot & s) {
    if (!s.tail_fixed || (s.saved.valid && s.saved.n_tokens == s.cached.size())) {
        return;
    }
    const size_t size = llama_state_seq_get_size_ext(s.ctx, 0, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
    s.saved.state.resize(size);
    s.saved.valid = size > 0 && llama_state_seq_get_data_ext(s.ctx, s.saved.state.data(), size, 0,
                                                             LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY) == size;
    s.saved.n_tokens = s.cached.size();
}

bool decoder::restore(model_slot & s, size_t keep_n) {
    if (!s.saved.valid || s.saved.n_tokens > keep_n) {
        return false;
    }
    llama_memory_t mem = llama_get_memory(s.ctx);
    const size_t size = s.saved.state.size();
    if (llama_state_seq_set_data_ext(s.ctx, s.saved.state.data(), size, 0, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY) != size ||
        !llama_memory_seq_rm(mem, 0, (llama_pos) s.saved.n_tokens, -1)) {
        s.saved.valid = false;
        return false;
    }
    s.cached.resize(s.saved.n_tokens);
    st.n_restored += 1;
    return true;
}

} // namespace cospec
