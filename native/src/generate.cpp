// The decoding loop: draft -> verify -> arbitrate, plus plain target-only and
// draft-only decoding through the same machinery.
#include "block_sources.h"
#include "calibration.h"
#include "decoder.h"
#include "engine.h"
#include "grammar.h"
#include "sampling.h"
#include "text_stream.h"
#include "token_choice.h"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

struct cospec_result {
    std::string text;
    std::vector<cospec_token> tokens;
    std::vector<int32_t> provenance;
    std::vector<cospec_decision> decisions;
    // With params.logprobs: logprobs_per_token entries per token (its own, then the likeliest).
    std::vector<cospec_token_logprob> logprobs;
    int32_t logprobs_per_token = 0;
    int32_t stop_reason = COSPEC_STOP_NONE;
    int32_t status = COSPEC_OK;
    std::string error;
    cospec_stats stats {};
};

namespace {

using cospec::clock_type;
using cospec::fill_batch;
using cospec::lap_timer;
using cospec::ms_since;
using cospec::nonfinite_logits;
using cospec::tuner_samples;

constexpr const char * GRAMMAR_PARSE_ERROR = "the grammar does not parse as GBNF, llama.cpp's grammar format (its "
                                             "parser writes why to standard error)";
constexpr uint64_t ARBITER_SEED_SALT = 0xa5b17e4c0ffee5edULL;

class generation {
  public:
    generation(cospec_engine & engine, const cospec_generate_params & params, cospec_result & result,
               const cospec_token * prompt, int32_t n_prompt)
        : e(engine), p(params), r(result), st(result.stats), arbiter_rng(params.seed ^ ARBITER_SEED_SALT),
          chooser(sampler_settings(params), params.seed, params.repeat_penalty, params.repeat_last_n, st.t_sample_ms) {
        const bool greedy = chooser.greedy();
        const bool keeping_arbiter = p.mode == COSPEC_MODE_SPECULATIVE && p.arbiter != nullptr && p.arbiter->can_keep();
        // An arbiter abstains on a prompt unlike those it learned from (its domain gate): no
        // mismatch is kept and its pass never runs, so the call is plain speculative decoding,
        // drafted as such (the engine's tuners and n-gram pool where greedy).
        arbiter_can_keep = keeping_arbiter && p.arbiter->admits(prompt, n_prompt);
        st.arbiter_abstained = keeping_arbiter && !arbiter_can_keep;
        const bool keep_draft_logits = arbiter_can_keep && p.arbiter->needs_draft_logits();
        keep_threshold = p.arbiter != nullptr ? p.arbiter->threshold() : 0.5f;
        // Where block lengths can change the output (a kept mismatch; sampling, whose random
        // stream follows the blocks) they must not depend on timing: this call's own tuners
        // take fixed cost models (calibration.h: a learned arbiter's recorded one, else the
        // engine's calibration; the call's settings override either) and learn acceptance from
        // this call's blocks (from the calibrated acceptance where no arbiter keeps). The output is then a
        // function of the inputs, the settings, the seed and the calibration.
        const bool timing_free = arbiter_can_keep || !greedy;
        if (timing_free) {
            call_tuner.use_fixed_costs(cospec::timing_free_costs(e, p, arbiter_can_keep));
            // A keeping arbiter's blocks start as its training states were drafted (its kept
            // mismatches count as accepted, so it sees longer runs than the draft alone).
            if (arbiter_can_keep) {
                call_tuner.set_acceptance_prior(cospec::draft_tuner::KEEPING_PRIOR_ACCEPTED,
                                                cospec::draft_tuner::KEEPING_PRIOR_REJECTED);
            } else if (e.calibrated && e.calibration.draft_acceptance_sampled >= 0.0) {
                // (A sampled call: the target's token is drawn, so its acceptance is the sampled one.)
                const cospec::acceptance_prior prior = cospec::prior_of(e.calibration.draft_acceptance_sampled);
                call_tuner.set_acceptance_prior(prior.accepted, prior.rejected, true);
            }
            tuner = &call_tuner;
        } else if (!p.adaptive_draft) {
            // Fixed lengths neither ask the engine's tuner nor teach it: their blocks would move
            // the clock of its probes and explorations, which an adaptive call did not choose.
            tuner = &call_tuner;
        } else {
            tuner = &e.tuner;
            if (p.draft_p_min != e.tuner_draft_p_min) {
                e.tuner.reset_acceptance();
                e.tuner_draft_p_min = p.draft_p_min;
            }
        }
        choose_sources(timing_free, keep_draft_logits);
    }

    ~generation() {
        e.head.listening = false; // the next call's target decodes are heard only if it drafts with the head
    }

    int32_t run(const cospec_token * prompt, int32_t n_prompt) {
        if (p.grammar != nullptr && p.grammar[0] != '\0') {
            // The grammar reads the tokens of the model that emits: the draft's in draft-only mode.
            const llama_vocab * vocab = p.mode == COSPEC_MODE_DRAFT_ONLY ? e.draft.vocab : e.target.vocab;
            if (!chooser.parse_grammar(vocab, p.grammar, p.grammar_root)) {
                r.stop_reason = COSPEC_STOP_ERROR;
                return cospec::fail(COSPEC_ERR_INVALID_ARGUMENT, GRAMMAR_PARSE_ERROR);
            }
        }
        if (p.logprobs) {
            r.logprobs_per_token = 1 + p.n_top_logprobs;
        }
        seq.assign(prompt, prompt + n_prompt);
        n_prompt_tokens = n_prompt;
        if (p.mode == COSPEC_MODE_DRAFT_ONLY && !e.vocab_difference.empty()) {
            seq = cospec::draft_prompt(e, p, prompt, n_prompt); // a draft of another vocabulary decodes alone in its own tokens
        }
        const size_t n_before_last = seq.size() - 1;
        for (const auto & source : sources) {
            source->begin(prompt, n_prompt);
        }

        // Prompt: every token but the last goes into the caches now; the last
        // one is the first input of the first step.
        const auto t_prompt = clock_type::now();
        int32_t status = COSPEC_OK;
        size_t reused = 0;
        if (p.mode == COSPEC_MODE_DRAFT_ONLY) {
            status = sync(e.draft, n_before_last, false, st.t_draft_ms, &reused);
        } else {
            status = sync(e.target, n_before_last, false, st.t_verify_ms, &reused);
            for (const auto & source : sources) {
                if (status == COSPEC_OK && stop == COSPEC_STOP_NONE) {
                    status = source->read_prompt(seq); // a draft model reads the prompt too
                }
            }
        }
        if (status == COSPEC_OK && stop == COSPEC_STOP_NONE && arbiter_can_keep) {
            p.arbiter->begin(prompt, n_prompt);
        }
        st.t_prompt_ms = ms_since(t_prompt);
        st.n_prompt_cached = (int32_t) reused;
        // Every prompt token not reused counts as evaluated, the last one too (it is decoded with
        // the first step, and its time counts there): prompt_n + cache_n is the prompt's length,
        // as llama-server reports them.
        st.n_prompt = (int32_t) (seq.size() - reused);
        // Prompt work is not generation work.
        st.t_draft_ms = 0.0;
        st.t_verify_ms = 0.0;
        st.n_target_decoded = 0;
        st.n_draft_decoded = 0;
        st.n_restored = 0;

        const auto t_gen = clock_type::now();
        while (status == COSPEC_OK && stop == COSPEC_STOP_NONE) {
            if (e.abort_flag.load()) {
                stop = COSPEC_STOP_ABORTED;
                break;
            }
            switch (p.mode) {
                case COSPEC_MODE_TARGET_ONLY: status = plain_step(e.target, COSPEC_PROV_TARGET, st.t_verify_ms); break;
                case COSPEC_MODE_DRAFT_ONLY:  status = plain_step(e.draft, COSPEC_PROV_DRAFT, st.t_draft_ms); break;
                default:                      status = speculative_step(); break;
            }
        }
        st.t_generate_ms = ms_since(t_gen);
        if (status != COSPEC_OK) {
            stop = COSPEC_STOP_ERROR;
        }
        flush_text();
        r.stop_reason = stop;
        return status;
    }

  private:
    cospec_engine & e;
    const cospec_generate_params & p;
    cospec_result & r;
    cospec_stats & st;
    std::mt19937_64 arbiter_rng; // its own stream: sampled decisions never shift token sampling
    // Token choice (penalty, grammar, greedy or sampled, the verify verdicts) and its random stream.
    cospec::token_chooser chooser;
    bool arbiter_can_keep = false;
    float keep_threshold = 0.5f;
    // The last block was an n-gram block refused at a mismatch that a keeping arbiter may decide:
    // the next step is drafted by a source whose mismatches it decides (the draft model), or plain.
    bool redraft_with_model = false;
    // The tuner of the draft model's blocks, which plain steps teach too (the engine's, or one of this call alone).
    cospec::draft_tuner call_tuner;
    cospec::draft_tuner * tuner = nullptr;
    // Where blocks come from, in the call's order (cospec_generate_params.draft_sources); the
    // source of the block being verified.
    std::vector<std::unique_ptr<cospec::block_source>> sources;
    cospec::block_source * current = nullptr;
    // Tokens in this call's last target decode (0: none yet, the prompt's
    // batch came last). llama.cpp rebuilds its graph when the size changes, so
    // only a decode of the same size as the last one times a fair cost.
    int32_t last_target_n = 0;

    std::vector<llama_token> seq; // prompt + generated tokens
    int32_t stop = COSPEC_STOP_NONE;
    cospec::decoder calls {e, st, stop};
    cospec::text_stream text {r.text, stop_strings(p)};
    std::vector<char> piece;

    // Per-block buffers, kept across steps to avoid reallocations.
    cospec::proposal proposed;
    std::vector<float> target_logits_copy;
    std::vector<llama_token> target_tokens;
    std::vector<uint8_t> mismatch;
    std::vector<float> p_keep;
    cospec_block block {};
    // The reply's draft positions the target judged, and how many it agreed with (the arbiter's
    // reply_drafted and reply_agreed: before the block it decides).
    struct { int32_t drafted = 0, agreed = 0; } reply_so_far, reply_before_block;
    int32_t n_prompt_tokens = 0;

    // The draft sources of this call in order, COSPEC_DRAFT_AUTO resolved (see enum
    // cospec_draft_source). timing_free: the n-gram drafter proposes from this call's text alone,
    // at this call's fixed costs.
    void choose_sources(bool timing_free, bool keep_draft_logits) {
        if (p.mode != COSPEC_MODE_SPECULATIVE) {
            return;
        }
        const cospec::source_env env {e, p, st, chooser, calls};
        bool has_model = false, has_ngram = false, has_head = false;
        for (int32_t i = 0; i < COSPEC_N_DRAFT_SOURCES && p.draft_sources[i] != COSPEC_DRAFT_NONE; ++i) {
            const int32_t src = p.draft_sources[i];
            if ((src == COSPEC_DRAFT_NGRAM || src == COSPEC_DRAFT_AUTO) && !has_ngram) {
                has_ngram = true;
                const cospec::cost_model lookup = cospec::lookup_costs(e, p);
                sources.push_back(std::make_unique<cospec::ngram_source>(env, timing_free ? &lookup : nullptr));
            }
            // The head drafts before the draft model: it reads the target itself. Beside an arbiter
            // that keeps mismatches it is a lookup's peer: its matches stand, and at its mismatch
            // the draft model drafts the position for the arbiter to decide.
            if ((src == COSPEC_DRAFT_HEAD || src == COSPEC_DRAFT_AUTO) && !has_head && e.head.ready()) {
                has_head = true;
                const cospec::cost_model fixed = cospec::lookup_costs(e, p);
                sources.push_back(std::make_unique<cospec::head_source>(env, timing_free ? &fixed : nullptr));
                e.head.listening = true;
            }
            if ((src == COSPEC_DRAFT_MODEL || src == COSPEC_DRAFT_AUTO) && !has_model) {
                has_model = true;
                if (!e.has_draft) {
                    continue;
                }
                if (e.vocab_difference.empty()) {
                    sources.push_back(std::make_unique<cospec::draft_model_source>(env, *tuner, keep_draft_logits));
                } else {
                    sources.push_back(std::make_unique<cospec::text_draft_source>(env, *tuner, keep_draft_logits));
                }
            }
        }
    }

    // ------------------------------------------------------------ llama.cpp calls

    // Make the cache of `s` hold exactly seq[0..n), reusing the longest prefix
    // it already holds. With want_logits the last of those tokens is decoded
    // now, so its logits are ready.
    int32_t sync(model_slot & s, size_t n, bool want_logits, double & t_acc, size_t * n_reused) {
        return calls.sync_to(s, seq, n, want_logits, t_acc, n_reused);
    }

    int32_t grammar_dead_end() {
        return cospec::fail(COSPEC_ERR_INVALID_ARGUMENT, "the grammar allows no token of the model's vocabulary here (text "
                                                         "so far: \"" + r.text.substr(r.text.size() > 80 ? r.text.size() - 80 : 0) +
                                                         "\")");
    }

    // ------------------------------------------------------------ output

    static cospec::sampler_config sampler_settings(const cospec_generate_params & params) {
        cospec::sampler_config cfg;
        cfg.temperature = params.temperature;
        cfg.top_k = params.top_k;
        cfg.top_p = params.top_p;
        cfg.min_p = params.min_p;
        return cfg;
    }

    // ------------------------------------------------------------ log-probabilities

    // Emit tok, chosen from row (the logits of the model that chose it, for its log-probability).
    void emit(llama_token tok, int32_t provenance, const float * row) {
        const llama_vocab * vocab = p.mode == COSPEC_MODE_DRAFT_ONLY ? e.draft.vocab : e.target.vocab;
        chooser.accept(vocab, tok);
        if (p.logprobs) {
            const int32_t n = p.mode == COSPEC_MODE_DRAFT_ONLY ? e.draft.n_vocab : e.target.n_vocab;
            cospec::token_logprobs(row, n, tok, p.n_top_logprobs, r.logprobs);
        }
        seq.push_back(tok);
        r.tokens.push_back(tok);
        r.provenance.push_back(provenance);
        st.n_generated += 1;
        for (const auto & source : sources) {
            source->append(tok);
        }
        switch (provenance) {
            case COSPEC_PROV_MATCH:    st.n_accepted += 1; break;
            case COSPEC_PROV_NGRAM:    st.n_accepted += 1; st.n_accepted_ngram += 1; break;
            case COSPEC_PROV_HEAD:     st.n_accepted += 1; st.n_accepted_head += 1; break;
            case COSPEC_PROV_KEPT:     st.n_kept += 1; break;
            case COSPEC_PROV_FALLBACK: st.n_fallback += 1; break;
            case COSPEC_PROV_BONUS:    st.n_bonus += 1; break;
            default:                   st.n_plain += 1; break;
        }
        if (llama_vocab_is_eog(vocab, tok) && !p.ignore_eos) {
            stop = COSPEC_STOP_EOG;
        } else if (text.append(token_piece(vocab, tok))) {
            stop = COSPEC_STOP_STRING;
        }
        if (p.token_callback != nullptr) {
            const std::string_view shown = text.take(stop != COSPEC_STOP_NONE);
            cospec_token_event event {tok, provenance, shown.data(), (int32_t) shown.size(), nullptr, 0};
            if (p.logprobs) {
                event.logprobs = r.logprobs.data() + r.logprobs.size() - (size_t) r.logprobs_per_token;
                event.n_top = p.n_top_logprobs;
            }
            const bool go_on = p.token_callback(&event, p.token_user_data);
            if (!go_on && stop == COSPEC_STOP_NONE) {
                stop = COSPEC_STOP_ABORTED;
            }
        }
        if (stop == COSPEC_STOP_NONE && st.n_generated >= p.n_predict) {
            stop = COSPEC_STOP_MAX_TOKENS;
        }
    }

    // A token's text (a reference into a buffer the next call reuses).
    std::string_view token_piece(const llama_vocab * vocab, llama_token tok) {
        if (piece.size() < 64) {
            piece.resize(64);
        }
        int32_t n = llama_token_to_piece(vocab, tok, piece.data(), (int32_t) piece.size(), 0, false);
        if (n < 0) {
            piece.resize((size_t) -n);
            n = llama_token_to_piece(vocab, tok, piece.data(), (int32_t) piece.size(), 0, false);
        }
        return {piece.data(), (size_t) std::max(n, 0)};
    }

    // What the text held back until now, passed on as the last callback's (token -1).
    void flush_text() {
        const std::string_view rest = text.take(true);
        if (p.token_callback != nullptr && !rest.empty()) {
            const cospec_token_event event {-1, -1, rest.data(), (int32_t) rest.size(), nullptr, 0};
            p.token_callback(&event, p.token_user_data);
        }
    }

    static std::vector<std::string> stop_strings(const cospec_generate_params & params) {
        std::vector<std::string> out;
        for (int32_t i = 0; i < params.n_stop; ++i) {
            if (params.stop[i] != nullptr) {
                out.emplace_back(params.stop[i]);
            }
        }
        return out;
    }

    // ------------------------------------------------------------ steps

    // One token from model `s`. *n_decoded (if given) says how many tokens it
    // decoded: 1 but after a prompt, or after tokens `s` has not seen.
    int32_t plain_step(model_slot & s, int32_t provenance, double & t_acc, size_t * n_decoded = nullptr) {
        const size_t n_past = seq.size() - 1; // position of the last token
        if (n_past >= (size_t) e.n_ctx) {
            stop = COSPEC_STOP_CONTEXT_FULL;
            return COSPEC_OK;
        }
        size_t n_reused = 0;
        const int32_t status = sync(s, n_past + 1, true, t_acc, &n_reused);
        if (n_decoded != nullptr) {
            *n_decoded = n_past + 1 - n_reused;
        }
        if (status != COSPEC_OK || stop != COSPEC_STOP_NONE) {
            return status;
        }
        const float * row = llama_get_logits_ith(s.ctx, -1);
        const llama_token tok = chooser.choose(row, s.n_vocab, seq);
        if (tok < 0) {
            return grammar_dead_end();
        }
        if (!std::isfinite(row[tok])) {
            return nonfinite_logits();
        }
        emit(tok, provenance, row);
        return COSPEC_OK;
    }

    // The most tokens the next block may hold: the token budget, the context and the batch.
    int32_t block_room(size_t n_past) const {
        int32_t k = p.n_predict - st.n_generated - 1;
        k = std::min(k, e.n_ctx - (int32_t) n_past - 1);
        return std::min(k, e.n_batch - 1);
    }

    // Decode [last, d_1..d_kd] with the target in one batch, logits everywhere,
    // and judge every position the walk may reach. Returns the verify rows.
    int32_t verify_block(size_t n_past, const float ** rows, std::optional<tuner_samples::verify_decode> & timing) {
        const int32_t kd = (int32_t) proposed.tokens.size();
        if (const int32_t status = sync(e.target, n_past, false, st.t_verify_ms, nullptr); status != COSPEC_OK || stop != COSPEC_STOP_NONE) {
            return status;
        }
        model_slot & t = e.target;
        calls.checkpoint(t);
        fill_batch(t, &seq.back(), 1, (llama_pos) n_past, true);
        for (int32_t i = 0; i < kd; ++i) {
            t.batch.token[i + 1] = proposed.tokens[i];
            t.batch.pos[i + 1] = (llama_pos) (n_past + 1 + i);
            t.batch.n_seq_id[i + 1] = 1;
            t.batch.seq_id[i + 1][0] = 0;
            t.batch.logits[i + 1] = true;
        }
        t.batch.n_tokens = kd + 1;
        lap_timer verify_time(st.t_verify_ms);
        if (const int32_t status = calls.decode(t, st.t_verify_ms, (llama_pos) n_past); status != COSPEC_OK || stop != COSPEC_STOP_NONE) {
            return status;
        }
        // A block after a decode of another size (plain steps, the prompt, a
        // block of another length) pays for a graph rebuild: not a fair sample.
        timing = {kd + 1, verify_time.lap(), last_target_n == kd + 1};
        last_target_n = kd + 1;
        t.cached.push_back(seq.back());
        t.cached.insert(t.cached.end(), proposed.tokens.begin(), proposed.tokens.end());
        st.n_blocks += kd > 0 ? 1 : 0; // (an empty block, a draft that declined at once, is a plain step's cost)
        st.n_drafted += kd;

        // Rows of the verification logits, contiguous for the arbiter.
        const int32_t nv = t.n_vocab;
        const float * logits = llama_get_logits(t.ctx);
        if (llama_get_logits_ith(t.ctx, kd) != logits + (size_t) kd * nv) {
            target_logits_copy.resize((size_t) (kd + 1) * nv);
            for (int32_t j = 0; j <= kd; ++j) {
                std::memcpy(target_logits_copy.data() + (size_t) j * nv, llama_get_logits_ith(t.ctx, j), sizeof(float) * nv);
            }
            logits = target_logits_copy.data();
        }
        *rows = logits;

        target_tokens.assign(kd + 1, -1);
        mismatch.assign(kd, 0);
        reply_before_block = reply_so_far;
        chooser.begin_verify();
        // The lossless walk stops at the first mismatch, so later positions
        // need no verdict; an arbiter that can keep sees the whole block.
        for (int32_t j = 0; j <= kd; ++j) {
            const cospec::token_chooser::verdict v = chooser.judge(logits + (size_t) j * nv, nv, seq, proposed.tokens, j,
                                                                   current->draft_probs(j));
            target_tokens[j] = v.token;
            if (j < kd) {
                mismatch[j] = v.mismatch;
            }
            if (target_tokens[j] < 0) {
                return grammar_dead_end();
            }
            if (!std::isfinite(logits[(size_t) j * nv + target_tokens[j]])) {
                return nonfinite_logits();
            }
            if (j < kd) {
                reply_so_far.drafted += 1;
                reply_so_far.agreed += !mismatch[j];
            }
            if (j < kd && mismatch[j] && !arbiter_decides()) {
                break;
            }
            if (j < kd) {
                chooser.walk_accept(e.target.vocab, proposed.tokens[j]); // every drafted token follows the grammar
            }
        }
        return COSPEC_OK;
    }

    // Ask the arbiter for P(keep) at every mismatch of the block.
    int32_t arbitrate(size_t n_past, const float * rows) {
        const int32_t kd = (int32_t) proposed.tokens.size();
        p_keep.assign(kd, 0.0f);
        block = cospec_block {};
        block.index = st.n_blocks - 1;
        block.n_draft = kd;
        block.n_vocab_target = e.target.n_vocab;
        block.n_vocab_draft = e.draft.n_vocab;
        block.draft = proposed.tokens.data();
        block.target = target_tokens.data();
        block.mismatch = mismatch.data();
        block.target_logits = rows;
        block.context = seq.data(); // the walk may have grown seq: its first n_context tokens are the block's context
        block.n_context = (int32_t) n_past + 1;
        block.temperature = p.temperature;
        block.n_prompt = n_prompt_tokens;
        block.reply_drafted = reply_before_block.drafted;
        block.reply_agreed = reply_before_block.agreed;
        current->describe(block); // what the arbiter reads of the draft
        const auto t0 = clock_type::now();
        int32_t rc;
        try {
            rc = p.arbiter->score(block, p_keep.data());
        } catch (const std::exception & ex) {
            st.t_arbiter_ms += ms_since(t0);
            return cospec::fail(COSPEC_ERR_ARBITER, std::string("arbiter '") + p.arbiter->name() + "' failed: " + ex.what());
        }
        st.t_arbiter_ms += ms_since(t0);
        st.n_arbiter_calls += 1;
        if (rc != 0) {
            if (e.abort_flag.load()) {
                stop = COSPEC_STOP_ABORTED; // the arbiter's own decode saw the abort
                return COSPEC_OK;
            }
            const std::string why = cospec_last_error();
            return cospec::fail(COSPEC_ERR_ARBITER, std::string("arbiter '") + p.arbiter->name() + "' reported error " +
                                                        std::to_string(rc) + (why.empty() ? "" : ": " + why));
        }
        return COSPEC_OK;
    }

    // An arbiter that keeps decides the draft model's mismatches; an n-gram or head block's are refused.
    bool arbiter_decides() const { return arbiter_can_keep && current->arbiter_may_decide(); }

    bool decide(float p_keep_i) {
        if (p.sample_arbiter) {
            return cospec::uniform01(arbiter_rng) < p_keep_i;
        }
        return p_keep_i >= keep_threshold;
    }

    // Walk the block: matches and kept mismatches go on, a rejected mismatch
    // emits the target's token and ends the block; a block that survives
    // whole earns the target's bonus token. The arbiter is asked when the walk
    // first reaches a mismatch, not before: where the output ends earlier (end
    // of generation, a stop string, the token budget) no verdict is needed, and
    // on short answers that is a large share of the blocks with a mismatch.
    // Its scores depend on the block alone, so asking late changes no decision.
    int32_t walk_block(size_t n_past, const float * rows, std::optional<tuner_samples::block_outcome> & outcome) {
        const int32_t kd = (int32_t) proposed.tokens.size();
        const size_t first_decision = r.decisions.size();
        bool scored = false;
        int32_t j = 0;
        for (; j < kd && stop == COSPEC_STOP_NONE; ++j) {
            const float * row = rows + (size_t) j * e.target.n_vocab;
            if (!mismatch[j]) {
                emit(proposed.tokens[j], current->match_provenance(), row);
                continue;
            }
            if (arbiter_can_keep && !current->arbiter_may_decide()) {
                // A keeping arbiter decides between the draft model's token and the target's, which a
                // lookup's mismatch does not show: nothing is emitted here, the draft model drafts
                // this position next, and the arbiter decides it there as it would without the lookup.
                redraft_with_model = true;
                break;
            }
            if (arbiter_decides() && !scored) {
                if (const int32_t status = arbitrate(n_past, rows); status != COSPEC_OK) {
                    return status;
                }
                scored = true;
                if (stop != COSPEC_STOP_NONE) {
                    break; // aborted during the arbiter's own decode
                }
            }
            const bool keep = arbiter_decides() && decide(p_keep[j]);
            if (arbiter_decides()) {
                r.decisions.push_back({st.n_blocks - 1, j, (int32_t) r.tokens.size(), p_keep[j], keep});
            }
            if (keep) {
                emit(proposed.tokens[j], COSPEC_PROV_KEPT, row);
            } else {
                emit(target_tokens[j], COSPEC_PROV_FALLBACK, row);
                break;
            }
        }
        const bool rejected = j < kd;
        // A block the draft cut short ended before K as a rejection ends it:
        // counted as one, a draft that declines every token (a high p-min)
        // brings the tuner to plain steps instead of asking for blocks forever.
        outcome = {kd, j, rejected || proposed.declined};
        if (!rejected && stop == COSPEC_STOP_NONE) {
            emit(target_tokens[kd], COSPEC_PROV_BONUS, rows + (size_t) kd * e.target.n_vocab);
        }
        if (r.decisions.size() > first_decision) {
            block.context = seq.data(); // emit() may have grown seq: the context's first n_context tokens stay
            p.arbiter->taken(block, r.decisions.data() + first_decision, (int32_t) (r.decisions.size() - first_decision));
        }
        return COSPEC_OK;
    }

    // The first source in order that offers drafts the block; no source offering, a plain target step.
    int32_t speculative_step() {
        const size_t n_past = seq.size() - 1; // position of the block's first input
        if (n_past >= (size_t) e.n_ctx) {
            stop = COSPEC_STOP_CONTEXT_FULL;
            return COSPEC_OK;
        }
        tuner_samples samples;
        cospec::draft_context ctx {seq, n_past, block_room(n_past), last_target_n};
        current = nullptr;
        for (size_t i = 0; i < sources.size() && current == nullptr; ++i) {
            if (redraft_with_model && !sources[i]->arbiter_may_decide()) {
                continue;
            }
            ctx.rate_to_beat = 0.0;
            for (size_t j = i + 1; j < sources.size(); ++j) {
                ctx.rate_to_beat = std::max(ctx.rate_to_beat, sources[j]->expected_rate(ctx));
            }
            if (sources[i]->offer(ctx, proposed, samples.draft)) {
                current = sources[i].get();
            }
        }
        redraft_with_model = false;
        const size_t n_before = r.tokens.size();
        const int32_t status = current != nullptr ? block_step(ctx, samples) : plain_target_step(samples);
        // The source's own tuner learns from its block (the draft model's from a plain step); the
        // others learn the target's costs.
        cospec::draft_tuner & own = current != nullptr ? current->tuner() : *tuner;
        tell_tuner(own, samples);
        for (const auto & source : sources) {
            if (&source->tuner() != &own && samples.verify) {
                source->tuner().observe_verify(samples.verify->n_tokens, samples.verify->ms, samples.verify->fair);
            }
        }
        for (const auto & source : sources) {
            source->stepped(current, (int32_t) (r.tokens.size() - n_before));
        }
        if (e.head.listening) {
            // The head keeps what the target's cache keeps of the output: the rows of the step's
            // batch the output took (the cache before n_past already was the output's).
            const std::vector<llama_token> & cached = e.target.cached;
            size_t n_valid = std::min(n_past, cached.size());
            while (n_valid < cached.size() && n_valid < seq.size() && cached[n_valid] == seq[n_valid]) {
                n_valid += 1;
            }
            e.head.kept(n_valid);
        }
        return status;
    }

    // The block current offered: drafted (where it drafts after offering), verified, walked.
    int32_t block_step(const cospec::draft_context & ctx, tuner_samples & samples) {
        if (const int32_t status = current->draft(ctx, proposed, samples.draft); status != COSPEC_OK || stop != COSPEC_STOP_NONE) {
            return status;
        }
        if ((int32_t) proposed.tokens.size() < p.n_draft_min) {
            proposed.tokens.clear(); // cut below the minimum (by --draft-p-min, the grammar): as if declined
        }
        if (proposed.tokens.empty() && !current->verifies_empty()) {
            current = nullptr;     // the step is a plain one
            samples.draft.reset(); // its time is the draft's, but no block followed it
            return plain_target_step(samples);
        }
        const float * rows = nullptr;
        const int32_t verified = verify_block(ctx.n_past, &rows, samples.verify);
        if (verified != COSPEC_OK || stop != COSPEC_STOP_NONE) {
            return verified;
        }
        current->verified((int32_t) proposed.tokens.size());
        const int32_t status = walk_block(ctx.n_past, rows, samples.block);
        current->walked(samples.block);
        return status;
    }

    // Nothing to draft: a plain target step, not a block.
    int32_t plain_target_step(tuner_samples & samples) {
        lap_timer verify_time(st.t_verify_ms);
        size_t n_decoded = 0;
        const int32_t status = plain_step(e.target, COSPEC_PROV_TARGET, st.t_verify_ms, &n_decoded);
        // What a plain step costs in a run of plain steps: not a prompt, and
        // not the first step after a block, which pays for llama.cpp
        // rebuilding its graph for one token after K + 1 (a cost of the
        // switch, which would otherwise make plain steps look dearer right
        // after every block and pull the tuner back into drafting).
        if (n_decoded == 1) {
            samples.verify = {1, verify_time.lap(), last_target_n == 1};
        }
        last_target_n = (int32_t) n_decoded;
        samples.block = {0, 0, false};
        return status;
    }

    // In the order the step took them: its draft calls, its verify, its outcome.
    static void tell_tuner(cospec::draft_tuner & to, const tuner_samples & samples) {
        if (samples.draft) {
            to.observe_draft(samples.draft->first_ms, samples.draft->step_ms, samples.draft->n_steps);
            if (samples.draft->catch_up_ms >= 0.0 && samples.draft->n_caught_up > (int32_t) cospec::BLOCK_CATCH_UP) {
                to.observe_catch_up(samples.draft->catch_up_ms, samples.draft->n_caught_up);
            }
        }
        if (samples.verify) {
            to.observe_verify(samples.verify->n_tokens, samples.verify->ms, samples.verify->fair);
        }
        if (samples.block) {
            to.observe_block(samples.block->n_drafted, samples.block->n_accepted, samples.block->ended_early);
        }
    }
};

// A refusal of one setting: *field names it for the caller (a binding maps it to its own
// spelling), and the message reads "FIELD: why".
int32_t refuse(const char ** field, const char * name, int32_t status, const std::string & why) {
    if (field != nullptr) {
        *field = name;
    }
    return cospec::fail(status, std::string(name) + ": " + why);
}

std::string in_range(int64_t lo, int64_t hi, int64_t got) {
    return "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + std::to_string(got);
}

// Everything cospec_generate checks before it runs that depends on the engine, the prompt and
// the arbiter; the settings' own ranges are cospec_generate_params_check's.
int32_t check_params(const cospec_engine * e, const cospec_token * prompt, int32_t n_prompt, const cospec_generate_params * p,
                     const char ** field) {
    if (const int32_t status = cospec_generate_params_check(p, field); status != COSPEC_OK) {
        return status;
    }
    if (e == nullptr) {
        return cospec::fail(COSPEC_ERR_INVALID_ARGUMENT, "cospec_generate: the engine must not be NULL");
    }
    if (prompt == nullptr || n_prompt <= 0) {
        return refuse(field, "prompt", COSPEC_ERR_INVALID_ARGUMENT, "the prompt is empty");
    }
    bool names_model = false, names_ngram = false;
    for (int32_t i = 0; i < COSPEC_N_DRAFT_SOURCES && p->draft_sources[i] != COSPEC_DRAFT_NONE; ++i) {
        const int32_t src = p->draft_sources[i];
        if (src == COSPEC_DRAFT_HEAD && p->mode == COSPEC_MODE_SPECULATIVE && !e->head.ready()) {
            return refuse(field, "draft_sources", COSPEC_ERR_NO_DRAFT,
                          "they name the head drafter, but the engine has none (an EAGLE-3 head opened as the draft, or "
                          "a target with multi-token-prediction layers)");
        }
        names_model = names_model || src == COSPEC_DRAFT_MODEL || src == COSPEC_DRAFT_AUTO;
        names_ngram = names_ngram || src == COSPEC_DRAFT_NGRAM || src == COSPEC_DRAFT_AUTO;
    }
    if (p->mode == COSPEC_MODE_DRAFT_ONLY && !e->has_draft) {
        return refuse(field, "mode", COSPEC_ERR_NO_DRAFT, "draft-only needs a draft model, but the engine was opened without one");
    }
    if (p->mode == COSPEC_MODE_SPECULATIVE && names_model && !names_ngram && !e->has_draft) {
        return refuse(field, "draft_sources", COSPEC_ERR_NO_DRAFT,
                      "they name the draft model alone, but the engine was opened without one");
    }
    const bool keeping = p->mode == COSPEC_MODE_SPECULATIVE && p->arbiter != nullptr && p->arbiter->can_keep();
    if (keeping && !names_model) {
        return refuse(field, "arbiter", COSPEC_ERR_INVALID_ARGUMENT,
                      std::string("'") + p->arbiter->name() + "' decides the draft model's mismatches, but the draft "
                          "sources leave the draft model out (ngram,draft keeps both)");
    }
    if (keeping && !e->has_draft) {
        return refuse(field, "arbiter", COSPEC_ERR_NO_DRAFT,
                      std::string("'") + p->arbiter->name() + "' decides the draft model's mismatches, but the engine has "
                          "no draft model");
    }
    // A LoRA arbiter runs the draft model, with its adapter, over the target's tokens at each
    // position: a draft of another vocabulary cannot read them. The features arbiter (and a
    // Python one) reads the draft where it chose its own token covering the position's text.
    if (keeping && p->arbiter->kind() == COSPEC_ARBITER_LORA && !e->vocab_difference.empty()) {
        return refuse(field, "arbiter", COSPEC_ERR_INVALID_ARGUMENT,
                      std::string("'") + p->arbiter->name() + "' runs the draft model over the target's tokens, which a "
                          "draft of another vocabulary cannot read (" + e->vocab_difference +
                          "); use a features arbiter trained for this pair, the target arbiter or fly");
    }
    if (p->arbiter != nullptr && p->arbiter->engine() != nullptr && p->arbiter->engine() != e) {
        return refuse(field, "arbiter", COSPEC_ERR_INVALID_ARGUMENT,
                      std::string("'") + p->arbiter->name() + "' was loaded for another engine");
    }
    for (int32_t i = 0; i < p->n_draft_prompt; ++i) {
        if (!e->has_draft || p->draft_prompt[i] < 0 || p->draft_prompt[i] >= e->draft.n_vocab) {
            return refuse(field, "draft_prompt", COSPEC_ERR_INVALID_ARGUMENT,
                          "token " + std::to_string(p->draft_prompt[i]) + " at index " + std::to_string(i) +
                              " is outside the draft's vocabulary");
        }
    }
    for (int32_t i = 0; i < n_prompt; ++i) {
        if (prompt[i] < 0 || prompt[i] >= e->target.n_vocab) {
            return refuse(field, "prompt", COSPEC_ERR_INVALID_ARGUMENT,
                          "token " + std::to_string(prompt[i]) + " at index " + std::to_string(i) +
                              " is outside the vocabulary (size " + std::to_string(e->target.n_vocab) + ")");
        }
    }
    if (p->mode == COSPEC_MODE_DRAFT_ONLY && e->vocab_difference.empty()) {
        for (int32_t i = 0; i < n_prompt; ++i) {
            if (prompt[i] >= e->draft.n_vocab) {
                return refuse(field, "prompt", COSPEC_ERR_INVALID_ARGUMENT,
                              "token " + std::to_string(prompt[i]) + " at index " + std::to_string(i) +
                                  " is outside the draft's vocabulary (size " + std::to_string(e->draft.n_vocab) + ")");
            }
        }
    }
    if (n_prompt >= e->n_ctx) {
        return refuse(field, "prompt", COSPEC_ERR_CONTEXT_FULL,
                      "it has " + std::to_string(n_prompt) + " tokens but the context holds " + std::to_string(e->n_ctx) +
                          " (one more position is needed to generate); shorten the prompt or raise n_ctx");
    }
    return COSPEC_OK;
}

} // namespace

int32_t cospec_generate_params_check(const cospec_generate_params * p, const char ** field) {
    cospec::clear_error();
    if (field != nullptr) {
        *field = "";
    }
    if (p == nullptr) {
        return cospec::fail(COSPEC_ERR_INVALID_ARGUMENT, "the params must not be NULL");
    }
    const int32_t bad = COSPEC_ERR_INVALID_ARGUMENT;
    if (p->mode < COSPEC_MODE_SPECULATIVE || p->mode > COSPEC_MODE_DRAFT_ONLY) {
        return refuse(field, "mode", bad, "unknown mode " + std::to_string(p->mode));
    }
    for (int32_t i = 0; i < COSPEC_N_DRAFT_SOURCES && p->draft_sources[i] != COSPEC_DRAFT_NONE; ++i) {
        if (p->draft_sources[i] < COSPEC_DRAFT_NONE || p->draft_sources[i] > COSPEC_DRAFT_HEAD) {
            return refuse(field, "draft_sources", bad, "unknown draft source " + std::to_string(p->draft_sources[i]));
        }
    }
    if (p->n_predict <= 0) {
        return refuse(field, "n_predict", bad, "must be positive, got " + std::to_string(p->n_predict));
    }
    if (p->n_draft <= 0 || p->n_draft > COSPEC_N_DRAFT_MAX) {
        return refuse(field, "n_draft", bad, in_range(1, COSPEC_N_DRAFT_MAX, p->n_draft));
    }
    if (p->n_draft_min < 0 || p->n_draft_min > p->n_draft) {
        return refuse(field, "n_draft_min", bad, in_range(0, p->n_draft, p->n_draft_min) + " (no longer than the longest block)");
    }
    if (p->n_draft_ngram <= 0 || p->n_draft_ngram > COSPEC_N_DRAFT_MAX) {
        return refuse(field, "n_draft_ngram", bad, in_range(1, COSPEC_N_DRAFT_MAX, p->n_draft_ngram));
    }
    if (!(p->draft_p_min >= 0.0f && p->draft_p_min <= 1.0f)) {
        return refuse(field, "draft_p_min", bad, "must be in [0, 1]");
    }
    if (!(p->temperature >= 0.0f) || !(p->temperature < 1e6f)) {
        return refuse(field, "temperature", bad, "must be a finite number >= 0");
    }
    if (p->top_k < 0) {
        return refuse(field, "top_k", bad, "must be >= 0");
    }
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f)) {
        return refuse(field, "top_p", bad, "must be in (0, 1]");
    }
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f)) {
        return refuse(field, "min_p", bad, "must be in [0, 1]");
    }
    if (!(p->repeat_penalty > 0.0f && p->repeat_penalty <= 100.0f)) {
        return refuse(field, "repeat_penalty", bad, "must be in (0, 100]");
    }
    if (p->repeat_last_n < -1) {
        return refuse(field, "repeat_last_n", bad, "must be >= -1 (-1: the whole context)");
    }
    if (!(p->draft_cost >= 0.0f && p->draft_cost <= 100.0f)) {
        return refuse(field, "draft_cost", bad, "must be in [0, 100] target steps (0: from the pair's sizes)");
    }
    if (!(std::isfinite(p->verify_cost) && p->verify_cost <= 100.0f)) {
        return refuse(field, "verify_cost", bad, "must be a finite number <= 100 target steps (negative: the default)");
    }
    if (p->n_top_logprobs < 0 || p->n_top_logprobs > COSPEC_N_TOP_LOGPROBS_MAX) {
        return refuse(field, "n_top_logprobs", bad, in_range(0, COSPEC_N_TOP_LOGPROBS_MAX, p->n_top_logprobs));
    }
    if (p->n_stop < 0 || (p->n_stop > 0 && p->stop == nullptr)) {
        return refuse(field, "stop", bad, "invalid array");
    }
    if (p->n_draft_prompt < 0 || (p->n_draft_prompt > 0 && p->draft_prompt == nullptr)) {
        return refuse(field, "draft_prompt", bad, "invalid array");
    }
    return COSPEC_OK;
}

int32_t cospec_generate_check(const cospec_engine * engine, const cospec_token * prompt, int32_t n_prompt,
                              const cospec_generate_params * params, const char ** field) {
    cospec::clear_error();
    return check_params(engine, prompt, n_prompt, params, field);
}

extern "C" {

cospec_generate_params cospec_generate_default_params(void) {
    cospec_generate_params p {};
    p.mode = COSPEC_MODE_SPECULATIVE;
    p.draft_sources[0] = COSPEC_DRAFT_AUTO;
    p.draft_sources[1] = COSPEC_DRAFT_NONE;
    p.arbiter = nullptr;
    p.n_predict = 128;
    p.n_draft = 8;
    p.n_draft_min = 0;
    p.n_draft_ngram = 32;
    p.draft_p_min = 0.0f;
    p.adaptive_draft = true;
    p.draft_cost = 0.0f;
    p.verify_cost = -1.0f;
    p.temperature = 0.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repeat_penalty = 1.0f;
    p.repeat_last_n = 64;
    p.seed = 0;
    p.sample_arbiter = false;
    p.ignore_eos = false;
    p.stop = nullptr;
    p.n_stop = 0;
    p.draft_prompt = nullptr;
    p.n_draft_prompt = 0;
    p.logprobs = false;
    p.n_top_logprobs = 0;
    p.grammar = nullptr;
    p.grammar_root = nullptr;
    p.token_callback = nullptr;
    p.token_user_data = nullptr;
    return p;
}

int32_t cospec_generate(cospec_engine * engine, const cospec_token * prompt, int32_t n_prompt,
                        const cospec_generate_params * params, cospec_result ** out) {
    cospec::clear_error();
    if (out != nullptr) {
        *out = nullptr;
    }
    if (const int32_t status = check_params(engine, prompt, n_prompt, params, nullptr); status != COSPEC_OK) {
        return status;
    }
    std::unique_lock<std::mutex> lock(engine->busy, std::try_to_lock);
    if (!lock.owns_lock()) {
        return cospec::fail(COSPEC_ERR_INVALID_ARGUMENT, "another generation is already running on this engine");
    }
    engine->abort_flag.store(false);
    const cospec::generating_thread owner(*engine);
    auto * result = new (std::nothrow) cospec_result();
    if (result == nullptr) {
        return cospec::fail(COSPEC_ERR_INTERNAL, "out of memory");
    }
    int32_t status;
    try {
        generation gen(*engine, *params, *result, prompt, n_prompt);
        status = gen.run(prompt, n_prompt);
    } catch (const std::exception & ex) {
        status = cospec::fail(COSPEC_ERR_INTERNAL, std::string("generation failed: ") + ex.what());
        result->stop_reason = COSPEC_STOP_ERROR;
        // Caches may be inconsistent after an exception: start the next call afresh.
        cospec_engine_reset(engine);
    }
    result->status = status;
    result->error = status == COSPEC_OK ? "" : cospec_last_error();
    if (out != nullptr) {
        *out = result;
    } else {
        delete result;
    }
    return status;
}

const char * cospec_result_text(const cospec_result * r, int32_t * len) {
    if (r == nullptr) {
        if (len) *len = 0;
        return "";
    }
    if (len) *len = (int32_t) r->text.size();
    return r->text.c_str();
}

const cospec_token * cospec_result_tokens(const cospec_result * r, int32_t * n) {
    if (n) *n = r ? (int32_t) r->tokens.size() : 0;
    return r ? r->tokens.data() : nullptr;
}

int32_t cospec_grammar_check(const cospec_engine * engine, int32_t which, const char * grammar, const char * root) {
    cospec::clear_error();
    if (engine == nullptr || grammar == nullptr || (which != 0 && which != 1) || (which == 1 && !engine->has_draft)) {
        return cospec::fail(COSPEC_ERR_INVALID_ARGUMENT, "cospec_grammar_check: no such model, or a NULL argument");
    }
    const llama_vocab * vocab = which == 0 ? engine->target.vocab : engine->draft.vocab;
    try {
        cospec::grammar_state g;
        if (!g.parse(vocab, grammar, root)) {
            return cospec::fail(COSPEC_ERR_INVALID_ARGUMENT, GRAMMAR_PARSE_ERROR);
        }
    } catch (const std::exception & ex) {
        return cospec::fail(COSPEC_ERR_INVALID_ARGUMENT, std::string(GRAMMAR_PARSE_ERROR) + ": " + ex.what());
    }
    return COSPEC_OK;
}

const cospec_token_logprob * cospec_result_logprobs(const cospec_result * r, int32_t * n_per_token) {
    const bool has = r != nullptr && r->logprobs_per_token > 0;
    if (n_per_token) *n_per_token = has ? r->logprobs_per_token : 0;
    return has ? r->logprobs.data() : nullptr;
}

const cospec_decision * cospec_result_decisions(const cospec_result * r, int32_t * n) {
    if (n) *n = r ? (int32_t) r->decisions.size() : 0;
    return r ? r->decisions.data() : nullptr;
}

const int32_t * cospec_result_provenance(const cospec_result * r, int32_t * n) {
    if (n) *n = r ? (int32_t) r->provenance.size() : 0;
    return r ? r->provenance.data() : nullptr;
}

int32_t cospec_result_stop_reason(const cospec_result * r) {
    return r ? r->stop_reason : COSPEC_STOP_NONE;
}

int32_t cospec_result_status(const cospec_result * r) {
    return r ? r->status : COSPEC_ERR_INVALID_ARGUMENT;
}

const char * cospec_result_error(const cospec_result * r) {
    return r ? r->error.c_str() : "";
}

cospec_stats cospec_result_stats(const cospec_result * r) {
    return r ? r->stats : cospec_stats {};
}

void cospec_result_free(cospec_result * r) {
    delete r;
}

} // extern "C"
