// Per-position features of a block: what the `features` arbiter sees, read
// off the logits the engine already has (no extra forward pass).
#include "internal.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace {

// Log-probabilities below this are clamped: tokens a model all but excludes
// (or that lie outside the draft's vocabulary) all look the same.
constexpr float LOGP_FLOOR = -30.0f;

const char * const FEATURE_NAMES[COSPEC_N_FEATURES] = {
    "mismatch",              // 1 where the target would not accept the draft token
    "position",              // i, the position in the block
    "block_length",          // n_draft
    "target_logp_draft",     // log p_target(d_i)
    "target_logp_target",    // log p_target(t_i)
    "draft_logp_draft",      // log p_draft(d_i)
    "draft_logp_target",     // log p_draft(t_i)
    "target_entropy",        // nats, temperature 1
    "draft_entropy",
    "target_margin",         // log-probability gap between the target's two best tokens
    "draft_margin",
    "mismatches_before",     // in this block
    "agreeing_run_after",    // consecutive matches right after i (what FLy's window looks at)
    "run_reaches_block_end", // 1 when that run lasts to the end of the block
    "mismatches_after",      // in this block
    "target_top3_entropy",   // FLy's gate: -sum p log p over the 3 likeliest tokens
    // Appended later (an arbiter reads the first n_features its file records):
    "target_rank_draft",     // log2(1 + tokens the target ranks above d_i)
    "draft_rank_target",     // log2(1 + tokens the draft ranks above t_i)
    "reply_position",        // log2(1 + reply tokens before position i)
    "reply_agreement",       // (agreed + 1) / (drafted + 2) over the reply's earlier blocks
    "target_entropy_next",   // the target's entropy one position on, with d_i in its context
    "target_logp_next",      // log p_target of the token after d_i there (d_i+1; the bonus at the end)
};

struct row_summary {
    double lse = 0.0;     // log of the softmax normaliser
    float entropy = 0.0f;
    float top[3] = {-INFINITY, -INFINITY, -INFINITY};
};

// One pass for the maximum and the three likeliest, one for the normaliser and the entropy: the
// exponentials in float (the features are floats; a float exp is several times cheaper over a
// 50k-token row), their sums in double, in chunks so that rounding does not grow with the vocabulary.
row_summary summarise(const float * row, int32_t n) {
    row_summary s;
    float m = row[0];
    for (int32_t i = 0; i < n; ++i) {
        const float x = row[i];
        m = std::max(m, x);
        if (x > s.top[2]) {
            s.top[2] = x;
            if (s.top[2] > s.top[1]) std::swap(s.top[1], s.top[2]);
            if (s.top[1] > s.top[0]) std::swap(s.top[0], s.top[1]);
        }
    }
    constexpr int32_t CHUNK = 256;
    double z_sum = 0.0, zp_sum = 0.0;
    for (int32_t c = 0; c < n; c += CHUNK) {
        float z_part = 0.0f, zp_part = 0.0f;
        const int32_t end = std::min(n, c + CHUNK);
        for (int32_t i = c; i < end; ++i) {
            const float z = row[i] - m;
            const float e = std::exp(z);
            z_part += e;
            zp_part += e * z;
        }
        z_sum += z_part;
        zp_sum += zp_part;
    }
    s.lse = m + std::log(z_sum);
    s.entropy = (float) (std::log(z_sum) - zp_sum / z_sum);
    return s;
}

float logp(const float * row, int32_t n, const row_summary & s, cospec_token tok) {
    if (tok < 0 || tok >= n) {
        return LOGP_FLOOR;
    }
    return std::max(LOGP_FLOOR, (float) (row[tok] - s.lse));
}

float top3_entropy(const row_summary & s) {
    double h = 0.0;
    for (float l : s.top) {
        if (std::isfinite(l)) {
            const double lp = l - s.lse;
            h -= std::exp(lp) * lp;
        }
    }
    return (float) h;
}

// Tokens ranked above tok (ties count below it: a model that cannot tell them apart ranks tok
// first); a token outside the row ranks last.
float log_rank(const float * row, int32_t n, cospec_token tok) {
    if (tok < 0 || tok >= n) {
        return std::log2(1.0f + (float) n);
    }
    const float x = row[tok];
    int32_t above = 0;
    for (int32_t i = 0; i < n; ++i) {
        above += row[i] > x;
    }
    return std::log2(1.0f + (float) above);
}

float margin(const row_summary & s) {
    return std::isfinite(s.top[1]) ? s.top[0] - s.top[1] : -LOGP_FLOOR;
}

} // namespace

namespace cospec {

int32_t block_features(const cospec_block * b, float * out, size_t out_size, const uint8_t * rows) {
    if (b == nullptr || out == nullptr || b->n_draft < 0 || b->target_logits == nullptr || b->n_vocab_target <= 0) {
        return fail(COSPEC_ERR_INVALID_ARGUMENT, "block features: incomplete block");
    }
    const int32_t n = b->n_draft;
    if (out_size / COSPEC_N_FEATURES < (size_t) n) {
        return fail(COSPEC_ERR_INVALID_ARGUMENT, "block features: output has room for " + std::to_string(out_size) +
                                                     " floats, " + std::to_string((size_t) n * COSPEC_N_FEATURES) + " needed");
    }
    if (n > 0 && (b->draft == nullptr || b->target == nullptr || b->mismatch == nullptr || b->draft_logits == nullptr ||
                  b->n_vocab_draft <= 0)) {
        return fail(COSPEC_ERR_INVALID_ARGUMENT, "block features: the block needs draft tokens, mismatches and draft logits");
    }
    int32_t mismatches_total = 0;
    for (int32_t i = 0; i < n; ++i) {
        mismatches_total += b->mismatch[i] != 0;
    }
    // (A hand-built block may leave the reply fields zero: then the whole context is the prompt.)
    const int32_t reply_before = std::max(0, b->n_context - std::max(0, b->n_prompt > 0 ? b->n_prompt : b->n_context));
    const int32_t drafted = std::max(0, b->reply_drafted);
    const float agreement = (float) (std::clamp(b->reply_agreed, 0, drafted) + 1) / (float) (drafted + 2);
    int32_t before = 0;
    row_summary next;    // the target's row next_of, summarised for the position before it
    int32_t next_of = -1;
    for (int32_t i = 0; i < n; ++i) {
        const int32_t here = b->mismatch[i] != 0;
        float * f = out + (size_t) i * COSPEC_N_FEATURES;
        if (rows != nullptr && !rows[i]) {
            std::fill(f, f + COSPEC_N_FEATURES, 0.0f);
            before += here;
            continue;
        }
        const float * trow = b->target_logits + (size_t) i * b->n_vocab_target;
        const float * drow = b->draft_logits + (size_t) i * b->n_vocab_draft;
        // (row i was summarised as the row after i - 1 where that position had features too)
        const row_summary ts = next_of == i ? next : summarise(trow, b->n_vocab_target);
        const row_summary ds = summarise(drow, b->n_vocab_draft);
        int32_t run = 0;
        while (i + 1 + run < n && !b->mismatch[i + 1 + run]) {
            run += 1;
        }
        f[0] = (float) here;
        f[1] = (float) i;
        f[2] = (float) n;
        f[3] = logp(trow, b->n_vocab_target, ts, b->draft[i]);
        f[4] = logp(trow, b->n_vocab_target, ts, b->target[i]);
        // (Across vocabularies the draft's own tokens there; a missing one reads as the floor.)
        f[5] = logp(drow, b->n_vocab_draft, ds, b->draft_own != nullptr ? b->draft_own[i] : b->draft[i]);
        f[6] = logp(drow, b->n_vocab_draft, ds, b->draft_alt != nullptr ? b->draft_alt[i] : b->target[i]);
        f[7] = ts.entropy;
        f[8] = ds.entropy;
        f[9] = margin(ts);
        f[10] = margin(ds);
        f[11] = (float) before;
        f[12] = (float) run;
        f[13] = (float) (i + 1 + run == n);
        f[14] = (float) (mismatches_total - before - here);
        f[15] = top3_entropy(ts);
        f[16] = log_rank(trow, b->n_vocab_target, b->draft[i]);
        f[17] = log_rank(drow, b->n_vocab_draft, b->draft_alt != nullptr ? b->draft_alt[i] : b->target[i]);
        f[18] = std::log2(1.0f + (float) (reply_before + i));
        f[19] = agreement;
        const float * next_row = trow + b->n_vocab_target; // row i + 1: the verify pass has n_draft + 1
        next = summarise(next_row, b->n_vocab_target);
        next_of = i + 1;
        f[20] = next.entropy;
        f[21] = logp(next_row, b->n_vocab_target, next, i + 1 < n ? b->draft[i + 1] : b->target[n]);
        before += here;
    }
    return COSPEC_OK;
}

} // namespace cospec

extern "C" {

const char * cospec_feature_name(int32_t index) {
    return index >= 0 && index < COSPEC_N_FEATURES ? FEATURE_NAMES[index] : "";
}

int32_t cospec_block_features(const cospec_block * b, float * out, size_t out_size) {
    return cospec::block_features(b, out, out_size, nullptr);
}

} // extern "C"
