// The loop's llama.cpp calls on either model: decoding a batch (timed, counted, its failures
// mapped to statuses and a stop), bringing a cache to a token sequence by its longest common
// prefix, and the saved states that let a recurrent memory roll a rejected block back. The
// generation and the draft-model block sources share one, so a draft's decodes count and stop
// the generation exactly as the target's do.
#pragma once

#include "engine.h"

#include <chrono>
#include <cstdint>
#include <vector>

namespace cospec {

using clock_type = std::chrono::steady_clock;

inline double ms_since(clock_type::time_point t0) {
    return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

// The time a running total of decode time (a stats field) gained since the
// last reading: the tuner's samples come off the clock the stats report.
class lap_timer {
  public:
    explicit lap_timer(const double & total) : total(total), from(total) {}
    double lap() {
        const double ms = total - from;
        from = total;
        return ms;
    }

  private:
    const double & total;
    double from;
};

// A model whose weights or metadata are broken can compute NaN or infinite
// logits; argmax then picks token 0 forever. Refuse to emit garbage.
int32_t nonfinite_logits();

class decoder {
  public:
    // stop: the generation's stop reason, which an aborted decode sets.
    decoder(cospec_engine & e, cospec_stats & st, int32_t & stop) : e(e), st(st), stop(stop) {}

    // Whether the generation stopped (an abort seen by a decode, among others).
    bool stopped() const { return stop != COSPEC_STOP_NONE; }

    // Decode s.batch. A failed or aborted decode may have left part of the
    // batch in the cache: drop everything from pos0 on so `cached` stays true.
    // The time includes the device's work: on a GPU llama_decode returns once
    // the work is queued, and the tuner's cost model needs what a step costs.
    // (Every decode's results are read right after it, so waiting here adds
    // no stall that reading them would not.)
    int32_t decode(model_slot & s, double & t_acc, llama_pos pos0);

    // Make the cache of `s` hold exactly tokens[0..n) (in s's vocabulary), reusing the longest
    // prefix it already holds. With want_logits the last of those tokens is decoded now, so its
    // logits are ready.
    int32_t sync_to(model_slot & s, const std::vector<llama_token> & tokens, size_t n, bool want_logits, double & t_acc,
                    size_t * n_reused);

    // Before decoding tokens a rollback may take back (a block's drafts), save the state of a
    // memory that cannot drop a tail. A failed save only costs the rollback a full re-decode.
    void checkpoint(model_slot & s);

  private:
    // Roll s back to its saved state where that lies within the first keep_n cached tokens: the
    // recurrent part from the checkpoint, the attention part of a hybrid by dropping its tail.
    bool restore(model_slot & s, size_t keep_n);

    cospec_engine & e;
    cospec_stats & st;
    int32_t & stop;
};

} // namespace cospec
