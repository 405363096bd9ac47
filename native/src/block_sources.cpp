#include "block_sources.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

namespace cospec {

namespace {

// The fixed cost model's price of an n-gram proposal, in target steps: a table lookup.
constexpr double NGRAM_DRAFT_COST = 0.001;

// The block a drafting source offers: at most --draft-max and the step's room; with adaptive
// drafting, what its tuner expects to pay (n_unread: tokens its first call catches up on).
int32_t offered_length(const source_env & env, draft_tuner & tuner, int32_t room, int32_t n_unread) {
    int32_t k = std::min(env.p.n_draft, room);
    if (env.p.adaptive_draft && k > 0) { // (a step the budget makes plain asks nothing, starts no probe)
        k = std::min(k, tuner.choose(env.p.n_draft, n_unread));
    }
    return k >= env.p.n_draft_min ? std::max(k, 0) : 0; // a block below the minimum would not be verified
}

// What that block promises per unit of its tuner's costs (0: it would not draft, or cannot say).
double promised_rate(const source_env & env, const draft_tuner & tuner, int32_t room, int32_t n_unread) {
    const int32_t k = std::min(env.p.n_draft, room);
    return env.p.adaptive_draft && k > 0 ? tuner.expected_rate(k, n_unread) : 0.0;
}

} // namespace

std::vector<llama_token> draft_prompt(const cospec_engine & e, const cospec_generate_params & p, const cospec_token * prompt,
                                      int32_t n_prompt) {
    if (p.draft_prompt != nullptr && p.n_draft_prompt > 0) {
        return std::vector<llama_token>(p.draft_prompt, p.draft_prompt + p.n_draft_prompt);
    }
    std::string text;
    for (int32_t i = 0; i < n_prompt; ++i) {
        if (i == 0 && llama_vocab_get_add_bos(e.target.vocab) && prompt[0] == llama_vocab_bos(e.target.vocab)) {
            continue; // the target's BOS: the draft gets its own
        }
        text += token_bytes(e.target.vocab, prompt[i], true);
    }
    std::vector<llama_token> out;
    if (llama_vocab_get_add_bos(e.draft.vocab)) {
        out.push_back(llama_vocab_bos(e.draft.vocab));
    }
    const std::vector<llama_token> body = encode(e.draft.vocab, text, true);
    out.insert(out.end(), body.begin(), body.end());
    return out;
}

// ------------------------------------------------------------ the draft model, either vocabulary

// How many tokens the next block drafts: never past the token budget, the context or the batch;
// with adaptive drafting, what the tuner expects to pay.
bool draft_model_base::offer(const draft_context & ctx, proposal & /*out*/,
                             std::optional<tuner_samples::draft_calls> & /*timing*/) {
    if (!can_read()) {
        return false;
    }
    k = offered_length(env, length_tuner, ctx.room, n_unread);
    return k > 0;
}

double draft_model_base::expected_rate(const draft_context & ctx) const {
    return can_read() ? promised_rate(env, length_tuner, ctx.room, n_unread) : 0.0;
}

void draft_model_base::stepped(const block_source * by, int32_t n_emitted) {
    if (by == nullptr) {
        n_unread += 1; // a block after plain steps first catches the draft up on them
    } else if (by != this) {
        n_unread += n_emitted; // the draft reads another source's block at its next block
    }
}

draft_model_source::draft_model_source(const source_env & env, draft_tuner & tuner, bool keep_logits)
    : draft_model_base(env, tuner, keep_logits), n_shared(std::min(env.e.target.n_vocab, env.e.draft.n_vocab)) {}

void draft_model_source::begin(const cospec_token * prompt, int32_t n_prompt) {
    for (int32_t i = 0; i < n_prompt; ++i) {
        readable = readable && prompt[i] < env.e.draft.n_vocab;
    }
}

int32_t draft_model_source::read_prompt(const std::vector<llama_token> & prompt) {
    if (!readable) {
        return COSPEC_OK;
    }
    return env.calls.sync_to(env.e.draft, prompt, prompt.size() - 1, false, env.st.t_draft_ms, nullptr);
}

void draft_model_source::append(llama_token tok) {
    readable = readable && tok < env.e.draft.n_vocab;
}

// k tokens after the text, one decode each. The draft's logits are copied per token only when
// the arbiter reads them.
int32_t draft_model_source::draft(const draft_context & ctx, proposal & out,
                                  std::optional<tuner_samples::draft_calls> & timing) {
    cospec_engine & e = env.e;
    cospec_stats & st = env.st;
    token_chooser & chooser = env.chooser;
    std::vector<llama_token> & drafted = out.tokens;
    drafted.clear();
    out.declined = false;
    const size_t n_past = ctx.n_past;
    // The first decode also catches the draft up on the tokens it has not
    // seen: after a block that is the bonus or fallback token (and the last
    // drafted one), after plain steps every token since. It is timed apart
    // from the later steps.
    lap_timer draft_time(st.t_draft_ms);
    size_t n_reused = 0;
    if (const int32_t status = env.calls.sync_to(e.draft, ctx.seq, n_past + 1, true, st.t_draft_ms, &n_reused);
        status != COSPEC_OK || env.calls.stopped()) {
        return status;
    }
    const double catch_up_ms = draft_time.lap();
    const bool long_catch_up = n_past + 1 - n_reused > BLOCK_CATCH_UP;
    const double first_ms = long_catch_up ? -1.0 : catch_up_ms;
    const int32_t n_caught_up = std::exchange(n_unread, 0);
    env.calls.checkpoint(e.draft);
    int32_t n_steps = 0; // single-token draft steps after the first call
    const int32_t nv = e.draft.n_vocab;
    if (keep_logits) {
        logits.resize((size_t) k * nv);
    }
    if (!chooser.greedy() && probs.size() < (size_t) k) {
        probs.resize(k);
    }
    chooser.begin_draft(); // the draft proposes only what the grammar allows
    for (int32_t i = 0; i < k; ++i) {
        const float * row = llama_get_logits_ith(e.draft.ctx, -1);
        if (keep_logits) {
            std::memcpy(logits.data() + (size_t) i * nv, row, sizeof(float) * nv);
        }
        const llama_token d = chooser.draft(row, n_shared, nv, ctx.seq, drafted, i, env.p.draft_p_min,
                                            chooser.greedy() ? nullptr : &probs[i]);
        if (d < 0) {
            // The draft is unsure (--draft-p-min: verifying further guesses would waste target
            // work), or the grammar allows none of its tokens here: the target decides alone.
            out.declined = true;
            break;
        }
        if (!std::isfinite(row[d])) {
            drafted.clear();
            return nonfinite_logits();
        }
        drafted.push_back(d);
        if (chooser.has_grammar() && llama_vocab_is_eog(e.target.vocab, d)) {
            break; // an end the grammar allows: nothing follows it
        }
        chooser.accept_drafted(e.target.vocab, d);
        if (i + 1 == k || e.abort_flag.load()) {
            break;
        }
        const llama_pos pos = (llama_pos) (n_past + 1 + i);
        fill_batch(e.draft, &d, 1, pos, true);
        if (const int32_t status = env.calls.decode(e.draft, st.t_draft_ms, pos); status != COSPEC_OK || env.calls.stopped()) {
            drafted.clear();
            return status;
        }
        e.draft.cached.push_back(d);
        n_steps += 1;
    }
    timing = {first_ms, n_steps > 0 ? draft_time.lap() / n_steps : 0.0, n_steps, long_catch_up ? catch_up_ms : -1.0,
              n_caught_up};
    return COSPEC_OK;
}

const std::vector<float> * draft_model_source::draft_probs(int32_t j) const {
    // (Greedy verdicts read none; past the block, the target's bonus token has no draft token.)
    return env.chooser.greedy() || (size_t) j >= probs.size() ? nullptr : &probs[(size_t) j];
}

void draft_model_source::describe(cospec_block & block) {
    block.draft_logits = keep_logits ? logits.data() : nullptr;
}

// ------------------------------------------------------------ a draft of another vocabulary

void text_draft_source::begin(const cospec_token * prompt, int32_t n_prompt) {
    bridge.begin(draft_prompt(env.e, env.p, prompt, n_prompt));
}

int32_t text_draft_source::read_prompt(const std::vector<llama_token> & /*prompt*/) {
    const std::vector<llama_token> & tokens = bridge.draft_tokens();
    return env.calls.sync_to(env.e.draft, tokens, tokens.size() - 1, false, env.st.t_draft_ms, nullptr);
}

// k of its own tokens after the reply as it reads it, their text in the target's tokens. A
// proposal that adds no text the target can take (it parts from the bytes held back) is empty.
int32_t text_draft_source::draft(const draft_context & ctx, proposal & out,
                                 std::optional<tuner_samples::draft_calls> & timing) {
    out.tokens.clear();
    out.declined = false;
    if (const int32_t status = draft_own_tokens(timing, out.declined, out.tokens); status != COSPEC_OK || env.calls.stopped()) {
        return status;
    }
    const int32_t budget = std::min(k, ctx.budget(COSPEC_N_DRAFT_MAX));
    if ((int32_t) out.tokens.size() > budget) {
        out.tokens.resize((size_t) budget);
    }
    env.chooser.trim(out.tokens, env.e.target.vocab);
    if (keep_logits) {
        align_rows(out.tokens);
    }
    return COSPEC_OK;
}

int32_t text_draft_source::draft_own_tokens(std::optional<tuner_samples::draft_calls> & timing, bool & declined,
                                            std::vector<llama_token> & converted) {
    cospec_engine & e = env.e;
    cospec_stats & st = env.st;
    own.clear();
    converted.clear();
    const std::vector<llama_token> & read = bridge.draft_tokens();
    lap_timer draft_time(st.t_draft_ms);
    size_t n_reused = 0;
    if (const int32_t status = env.calls.sync_to(e.draft, read, read.size(), true, st.t_draft_ms, &n_reused);
        status != COSPEC_OK || env.calls.stopped()) {
        return status;
    }
    const double catch_up_ms = draft_time.lap();
    // After a text block the catch-up is the accepted text re-encoded, often more than
    // BLOCK_CATCH_UP tokens: it is what a block's first call costs here, so it is timed;
    // after plain steps it reads every token since, and is timed apart.
    const double first_ms = after_text_block ? catch_up_ms : -1.0;
    const int32_t n_caught_up = std::exchange(n_unread, 0);
    env.calls.checkpoint(e.draft);
    int32_t n_steps = 0;
    const int32_t nv = e.draft.n_vocab;
    // k counts the target's tokens, the unit the target verifies and the tuner's acceptance and
    // verify costs count in: the draft steps until its text makes k of them (a few more of its
    // own tokens where its tokens are shorter, fewer where longer), within a bound.
    const int32_t own_max = MAX_OWN_PER_TARGET * k;
    for (int32_t i = 0; i < own_max; ++i) {
        const float * row = llama_get_logits_ith(e.draft.ctx, -1);
        if (keep_logits) {
            logits.resize((size_t) (i + 1) * nv);
            std::memcpy(logits.data() + (size_t) i * nv, row, sizeof(float) * nv);
        }
        const llama_token d = env.chooser.draft_free(row, nv, env.p.draft_p_min);
        if (d < 0) {
            declined = true;
            break;
        }
        if (!std::isfinite(row[d])) {
            return nonfinite_logits();
        }
        if (llama_vocab_is_eog(e.draft.vocab, d)) {
            break; // the draft would end here: its text so far is the proposal
        }
        own.push_back(d);
        bridge.to_target(own.data(), (int32_t) own.size(), converted);
        if ((int32_t) converted.size() >= k || i + 1 == own_max || e.abort_flag.load() ||
            (converted.empty() && bridge.parts_from_reply(own.data(), (int32_t) own.size()))) {
            break;
        }
        const llama_pos pos = (llama_pos) (read.size() + i);
        fill_batch(e.draft, &d, 1, pos, true);
        if (const int32_t status = env.calls.decode(e.draft, st.t_draft_ms, pos); status != COSPEC_OK || env.calls.stopped()) {
            return status;
        }
        e.draft.cached.push_back(d);
        n_steps += 1;
    }
    // Its later steps' time per target token after the first: a draft step in the tuner's unit.
    const int32_t n_target_steps = std::max((int32_t) converted.size() - 1, 0);
    const double later_ms = draft_time.lap();
    timing = {first_ms, n_target_steps > 0 ? later_ms / n_target_steps : 0.0, n_steps > 0 ? n_target_steps : 0,
              after_text_block ? -1.0 : catch_up_ms, n_caught_up};
    return COSPEC_OK;
}

void text_draft_source::align_rows(const std::vector<llama_token> & drafted) {
    const text_bridge::alignment a = bridge.align(own.data(), (int32_t) own.size(), drafted);
    const size_t nv = (size_t) env.e.draft.n_vocab;
    aligned_logits.resize(drafted.size() * nv);
    own_at.resize(drafted.size());
    starts_with_own.assign(a.starts_there.begin(), a.starts_there.end());
    for (size_t i = 0; i < drafted.size(); ++i) {
        const size_t j = (size_t) a.covering[i];
        std::memcpy(aligned_logits.data() + i * nv, logits.data() + j * nv, sizeof(float) * nv);
        own_at[i] = own[j];
    }
}

void text_draft_source::describe(cospec_block & block) {
    if (!keep_logits) {
        block.draft_logits = nullptr;
        return;
    }
    block.draft_logits = aligned_logits.data();
    // The draft's token for the target's text at a position where its own token begins.
    const int32_t kd = block.n_draft;
    alt_at.assign(kd, -1);
    for (int32_t i = 0; i < kd; ++i) {
        if (starts_with_own[i]) {
            const std::vector<llama_token> alt =
                encode(env.e.draft.vocab, token_bytes(env.e.target.vocab, block.target[i], false), false);
            alt_at[i] = alt.empty() ? -1 : alt[0];
        }
    }
    block.draft_own = own_at.data();
    block.draft_alt = alt_at.data();
}

void text_draft_source::verified(int32_t /*n_drafted*/) {
    after_text_block = true;
}

void text_draft_source::stepped(const block_source * by, int32_t n_emitted) {
    draft_model_base::stepped(by, n_emitted);
    if (by == nullptr) {
        after_text_block = false;
    }
}

// ------------------------------------------------------------ the n-gram drafter

ngram_source::ngram_source(const source_env & env, const cost_model * fixed_costs) : env(env) {
    if (fixed_costs != nullptr) {
        cost_model costs = *fixed_costs;
        costs.first_draft = costs.draft_step = NGRAM_DRAFT_COST;
        call_tuner.use_fixed_costs(costs);
        call_drafter.set_prior(env.e.calibrated ? env.e.calibration.ngram_acceptance : nullptr);
        drafter = &call_drafter;
        length_tuner = &call_tuner;
    } else {
        drafter = &env.e.ngram;
        length_tuner = &env.e.ngram_tuner;
    }
}

// The drafter's proposal for the next block, where it has one and its tuner takes a block now.
// The tuner weighs each proposed token by the acceptance the drafter learned at its match length,
// so a copied span (long matches, accepted in runs) is verified far further than a 2-token match
// in chat.
bool ngram_source::offer(const draft_context & ctx, proposal & out, std::optional<tuner_samples::draft_calls> & timing) {
    const int32_t k_max = std::min(env.p.n_draft_ngram, ctx.room);
    if (k_max <= 0) {
        return false;
    }
    const auto t0 = clock_type::now();
    drafter->propose(k_max, out.tokens);
    env.chooser.trim(out.tokens, env.e.target.vocab);
    const double lookup_ms = std::max(ms_since(t0), 1e-6);
    if (out.tokens.empty()) {
        return false;
    }
    const int32_t n = (int32_t) out.tokens.size();
    // Where the draft model's block promises more for this step (a draft that agrees more often
    // than this match is accepted), the proposal is held and the draft model drafts.
    const int32_t k = env.p.adaptive_draft ? length_tuner->choose_for_proposal(drafter->acceptance().data(), n,
                                                                                ctx.last_target_n - 1, ctx.rate_to_beat)
                                           : n;
    if (k <= 0 || k < env.p.n_draft_min) {
        drafter->feedback(0, 0);
        length_tuner->observe_held();
        out.tokens.clear();
        return false;
    }
    // The n-gram tuner learns acceptance from the drafter's estimates, not from how blocks end.
    out.declined = false;
    out.tokens.resize((size_t) k);
    timing = tuner_samples::draft_calls {lookup_ms, 0.0, 0};
    return true;
}

void ngram_source::verified(int32_t n_drafted) {
    n_proposed = n_drafted;
    env.st.n_blocks_ngram += 1;
    env.st.n_drafted_ngram += n_drafted;
}

void ngram_source::walked(const std::optional<tuner_samples::block_outcome> & outcome) {
    if (outcome) {
        drafter->feedback(n_proposed, outcome->n_accepted);
    }
}

// ------------------------------------------------------------ llama.cpp's head drafters

namespace {
// The fixed cost model's price of a head's draft step, in target steps: one decoder layer (and
// an EAGLE-3 head's fusion of three hidden states) against the target's whole stack. Timed
// calls measure it; calls whose lengths may not depend on timing take this.
constexpr double HEAD_DRAFT_COST = 0.1;
} // namespace

head_source::head_source(const source_env & env, const cost_model * fixed_costs) : env(env) {
    if (fixed_costs != nullptr) {
        cost_model costs = *fixed_costs;
        costs.first_draft = costs.draft_step = HEAD_DRAFT_COST; // no catch-up: it hears every target decode
        call_tuner.use_fixed_costs(costs);
        length_tuner = &call_tuner;
    } else {
        length_tuner = &env.e.head_tuner;
    }
}

bool head_source::offer(const draft_context & ctx, proposal & /*out*/, std::optional<tuner_samples::draft_calls> & /*timing*/) {
    if (!env.e.head.ready() || env.e.head.stale() || env.e.head.n_seen() != ctx.n_past) {
        return false;
    }
    k = offered_length(env, *length_tuner, ctx.room, 0);
    // A block the drafter cannot make longer is not one it declined to: its tuner asks no more.
    if (const int32_t limit = env.e.head.draft_limit(); limit > 0) {
        k = std::min(k, limit);
    }
    return k > 0;
}

double head_source::expected_rate(const draft_context & ctx) const {
    return env.e.head.ready() ? promised_rate(env, *length_tuner, ctx.room, 0) : 0.0;
}

int32_t head_source::draft(const draft_context & ctx, proposal & out, std::optional<tuner_samples::draft_calls> & timing) {
    const auto t0 = clock_type::now();
    if (const int32_t status = env.e.head.draft(ctx.seq, ctx.n_past, k, out.tokens); status != COSPEC_OK) {
        return status;
    }
    const double ms = ms_since(t0);
    env.st.t_draft_ms += ms; // llama.cpp's decodes, not the engine's decoder: timed here
    env.chooser.trim(out.tokens, env.e.target.vocab);
    out.declined = (int32_t) out.tokens.size() < k;
    const int32_t n = std::max<int32_t>(1, (int32_t) out.tokens.size());
    // One call drafted them all: each draft step's share of it.
    timing = tuner_samples::draft_calls {ms / n, ms / n, n - 1};
    return COSPEC_OK;
}

void head_source::verified(int32_t n_drafted) {
    env.st.n_blocks_head += 1;
    env.st.n_drafted_head += n_drafted;
}

} // namespace cospec
