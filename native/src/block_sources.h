// Where a speculative step's block comes from. The loop asks its sources in the call's order
// (cospec_generate_params.draft_sources) whether they draft the step's block; the first that
// offers drafts it, the target verifies it and the loop walks it, and a step no source offers
// is a plain target step. A source says what the verify and the walk need to know of its block
// (its draft's probabilities, its provenance, whether an arbiter may keep its mismatches) and
// hears what became of it. As llama.cpp's common/speculative.cpp chains its drafting
// implementations, a new source is one more class here, not another branch in the loop.
#pragma once

#include "decoder.h"
#include "draft_tuner.h"
#include "engine.h"
#include "head_drafter.h"
#include "ngram_drafter.h"
#include "text_bridge.h"
#include "token_choice.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

namespace cospec {

// Tokens a block's first draft call catches up on after a block: the last
// drafted token and the target's bonus or fallback. A longer catch-up (after
// plain steps) is no draft step, so the tuner is not told its time.
constexpr size_t BLOCK_CATCH_UP = 2;

// What one speculative step tells the tuner (the arguments of its observe_*
// calls), collected as the step runs and handed over when it ends. A part is
// absent where the step ended (an error, an abort) before taking it.
struct tuner_samples {
    struct draft_calls {
        double first_ms; // < 0: a long catch-up, not timed
        double step_ms;  // the mean of the later steps
        int32_t n_steps;
        double catch_up_ms = -1.0; // a long catch-up's time (< 0: none), and the reply tokens it read
        int32_t n_caught_up = 0;
    };
    struct verify_decode {
        int32_t n_tokens;
        double ms;
        bool fair; // the target's decode before it had the same size
    };
    struct block_outcome {
        int32_t n_drafted;
        int32_t n_accepted;
        bool ended_early;
    };
    std::optional<draft_calls> draft;
    std::optional<verify_decode> verify;
    std::optional<block_outcome> block;
};

// What the sources share of the generation: its engine and settings, its stats, its token
// choice (one random stream) and its llama.cpp calls.
struct source_env {
    cospec_engine & e;
    const cospec_generate_params & p;
    cospec_stats & st;
    token_chooser & chooser;
    decoder & calls;
};

// The loop's state a source drafts after.
struct draft_context {
    const std::vector<llama_token> & seq; // the prompt and the reply so far, in the target's tokens
    size_t n_past;                        // the block's first input: seq's last token
    int32_t room;                         // the most tokens a block may hold: the token budget, the context, the batch
    int32_t last_target_n;                // tokens in the target's last decode (0: the prompt's came last)
    double rate_to_beat = 0.0;            // what the sources after this one promise for the step (expected_rate)

    // The most tokens a block of this source may hold (k_max: its own limit), at least 0.
    int32_t budget(int32_t k_max) const { return std::max(std::min(k_max, room), 0); }
};

// The block a source drafts: target tokens, and whether the source stopped it itself.
struct proposal {
    std::vector<llama_token> tokens;
    bool declined = false; // the draft cut the block short (--draft-p-min, the grammar)
};

class block_source {
  public:
    virtual ~block_source() = default;

    // The call's prompt, in the target's tokens (nothing is decoded yet).
    virtual void begin(const cospec_token * /*prompt*/, int32_t /*n_prompt*/) {}
    // Once the target holds the prompt but its last token: a source that runs a model reads it.
    virtual int32_t read_prompt(const std::vector<llama_token> & /*prompt*/) { return COSPEC_OK; }

    // Whether this source drafts the step's block. A source whose proposal is a lookup makes it
    // here (into out, with its time); one that runs a model only decides to, and drafts in draft().
    virtual bool offer(const draft_context & ctx, proposal & out, std::optional<tuner_samples::draft_calls> & timing) = 0;
    // Draft the block offered (out holds it after; a status other than COSPEC_OK, or a stop, ends the step).
    virtual int32_t draft(const draft_context & /*ctx*/, proposal & /*out*/,
                          std::optional<tuner_samples::draft_calls> & /*timing*/) {
        return COSPEC_OK;
    }
    // The tokens per unit of its tuner's costs its block would promise now (0: it would not draft,
    // or cannot say): a source before it drafts only where it promises more.
    virtual double expected_rate(const draft_context & /*ctx*/) const { return 0.0; }
    // Whether a block with no token is still verified (a block the draft declined at once teaches
    // its tuner to stop asking); otherwise the step becomes a plain target step.
    virtual bool verifies_empty() const { return true; }

    // The target's verdicts: the draft's distribution at block position j, which lossless
    // speculative sampling accepts its token by (nullptr: proposed with certainty, q = 1).
    virtual const std::vector<float> * draft_probs(int32_t /*j*/) const { return nullptr; }
    // The provenance of a drafted token the target agrees with.
    virtual int32_t match_provenance() const { return COSPEC_PROV_MATCH; }
    // Whether an arbiter that keeps mismatches decides this source's. Where it may not (a lookup,
    // which shows no draft model's view), a mismatch in such a call emits nothing and the next
    // step is the draft model's (generate.cpp's walk).
    virtual bool arbiter_may_decide() const { return true; }
    // What an arbiter reads of the draft in a block of this source (block.target is filled).
    virtual void describe(cospec_block & /*block*/) {}

    // The target decoded the block (n_drafted tokens), and the walk of it ended (outcome absent
    // where the step stopped before).
    virtual void verified(int32_t /*n_drafted*/) {}
    virtual void walked(const std::optional<tuner_samples::block_outcome> & /*outcome*/) {}
    // A step ended: the block of source `by` (nullptr: a plain target step) emitted n tokens.
    virtual void stepped(const block_source * /*by*/, int32_t /*n_emitted*/) {}
    // A token joined the output.
    virtual void append(llama_token /*tok*/) {}

    // The tuner that chooses this source's block lengths and learns from its blocks.
    virtual draft_tuner & tuner() = 0;
};

// The target prompt's text in the draft's tokens (its BOS first where its tokenizer adds one), or
// the caller's own rendering of the conversation for it (params.draft_prompt).
std::vector<llama_token> draft_prompt(const cospec_engine & e, const cospec_generate_params & p, const cospec_token * prompt,
                                      int32_t n_prompt);

// A draft model's part common to both vocabularies: block lengths from the tuner, and the reply
// tokens other steps wrote since the draft last read the text (its next block catches up on them).
class draft_model_base : public block_source {
  public:
    draft_model_base(const source_env & env, draft_tuner & tuner, bool keep_logits)
        : env(env), length_tuner(tuner), keep_logits(keep_logits) {}

    bool offer(const draft_context & ctx, proposal & out, std::optional<tuner_samples::draft_calls> & timing) override;
    double expected_rate(const draft_context & ctx) const override;
    void stepped(const block_source * by, int32_t n_emitted) override;
    draft_tuner & tuner() override { return length_tuner; }

  protected:
    // False where the draft cannot read the text (a token beyond its vocabulary).
    virtual bool can_read() const { return true; }

    source_env env;
    draft_tuner & length_tuner;
    const bool keep_logits;      // an arbiter reads the draft's logits
    int32_t k = 0;               // the block length offered
    int32_t n_unread = 0;        // tokens other steps wrote since the draft last read the text
    std::vector<float> logits;   // the draft's rows, per own token (keep_logits)
};

// The draft model, in the target's vocabulary (but for a few padding ids): it drafts the target's
// tokens one at a time, and each comes with its sampling distribution, which the target's
// acceptance test weighs it by.
class draft_model_source : public draft_model_base {
  public:
    draft_model_source(const source_env & env, draft_tuner & tuner, bool keep_logits);

    void begin(const cospec_token * prompt, int32_t n_prompt) override;
    int32_t read_prompt(const std::vector<llama_token> & prompt) override;
    int32_t draft(const draft_context & ctx, proposal & out, std::optional<tuner_samples::draft_calls> & timing) override;
    const std::vector<float> * draft_probs(int32_t j) const override;
    void describe(cospec_block & block) override;
    void append(llama_token tok) override;

  protected:
    bool can_read() const override { return readable; }

  private:
    // False once the text holds a token beyond the draft's vocabulary (a draft may lack a few of
    // the target's padding tokens): from then on the steps are plain target steps.
    bool readable = true;
    int32_t n_shared; // token ids both vocabularies share
    std::vector<std::vector<float>> probs;
};

// A draft model of another vocabulary drafts text: the bridge re-encodes the reply for it and
// its proposals for the target. Its tokens are proposed with certainty (its probabilities are
// over its own tokens), as the n-gram drafter's are.
class text_draft_source : public draft_model_base {
  public:
    text_draft_source(const source_env & env, draft_tuner & tuner, bool keep_logits)
        : draft_model_base(env, tuner, keep_logits), bridge(env.e.target.vocab, env.e.draft.vocab) {}

    void begin(const cospec_token * prompt, int32_t n_prompt) override;
    int32_t read_prompt(const std::vector<llama_token> & prompt) override;
    int32_t draft(const draft_context & ctx, proposal & out, std::optional<tuner_samples::draft_calls> & timing) override;
    bool verifies_empty() const override { return false; } // no text the target can take: a plain step
    void describe(cospec_block & block) override;
    void verified(int32_t n_drafted) override;
    void stepped(const block_source * by, int32_t n_emitted) override;
    void append(llama_token tok) override { bridge.append_target(tok); }

  private:
    // The draft's own next tokens after the reply as the bridge writes it for the draft, until
    // their text makes k target tokens (converted: them, continuing the reply).
    int32_t draft_own_tokens(std::optional<tuner_samples::draft_calls> & timing, bool & declined,
                             std::vector<llama_token> & converted);
    // The most of its own tokens a text block drafts per target token of its length.
    static constexpr int32_t MAX_OWN_PER_TARGET = 4;
    // What an arbiter reads of the draft at each target position of the block: the row where the
    // draft chose its token covering that position's first byte, and that token.
    void align_rows(const std::vector<llama_token> & drafted);

    text_bridge bridge;
    bool after_text_block = false;   // the last step verified a text block (its catch-up is a block's)
    std::vector<llama_token> own;    // the draft's proposal in its own tokens
    std::vector<float> aligned_logits;
    std::vector<llama_token> own_at, alt_at;
    std::vector<uint8_t> starts_with_own; // the target token begins where own_at's does
};

// The n-gram drafter (ngram_drafter.h): a proposal looked up in the texts seen, verified as far
// as its tuner finds it pays at the acceptance the drafter learned per match length. An arbiter
// does not decide its mismatches (it learned the draft model's, not a lookup's): with one that
// keeps, the draft model drafts the mismatched position next and the arbiter decides it there.
class ngram_source : public block_source {
  public:
    // fixed_costs (target steps): where the output must be a function of the call's inputs (an
    // arbiter that keeps, sampling), proposals come from this call's text alone and lengths from
    // these costs and this call's counts (from the calibrated acceptance), not from the engine's
    // pool and clock. nullptr: the engine's pool and tuner.
    ngram_source(const source_env & env, const cost_model * fixed_costs);

    void begin(const cospec_token * prompt, int32_t n_prompt) override { drafter->begin(prompt, (size_t) n_prompt); }
    bool offer(const draft_context & ctx, proposal & out, std::optional<tuner_samples::draft_calls> & timing) override;
    int32_t match_provenance() const override { return COSPEC_PROV_NGRAM; }
    bool arbiter_may_decide() const override { return false; }
    void verified(int32_t n_drafted) override;
    void walked(const std::optional<tuner_samples::block_outcome> & outcome) override;
    void append(llama_token tok) override { drafter->append(tok); }
    draft_tuner & tuner() override { return *length_tuner; }

  private:
    source_env env;
    ngram_drafter call_drafter;
    draft_tuner call_tuner;
    ngram_drafter * drafter;
    draft_tuner * length_tuner;
    int32_t n_proposed = 0; // the block verified
};

// llama.cpp's head drafters (head_drafter.h): an EAGLE-3 head or the target's MTP layers draft
// from the target's own hidden states, so their blocks imitate the target. They are proposed with
// certainty (llama.cpp's drafters return tokens, top-1), verified losslessly: an arbiter that
// keeps mismatches does not decide them. fixed_costs: as for the n-gram drafter.
class head_source : public block_source {
  public:
    head_source(const source_env & env, const cost_model * fixed_costs);

    bool offer(const draft_context & ctx, proposal & out, std::optional<tuner_samples::draft_calls> & timing) override;
    int32_t draft(const draft_context & ctx, proposal & out, std::optional<tuner_samples::draft_calls> & timing) override;
    double expected_rate(const draft_context & ctx) const override;
    int32_t match_provenance() const override { return COSPEC_PROV_HEAD; }
    bool arbiter_may_decide() const override { return false; }
    void verified(int32_t n_drafted) override;
    draft_tuner & tuner() override { return *length_tuner; }

  private:
    source_env env;
    draft_tuner call_tuner;
    draft_tuner * length_tuner;
    int32_t k = 0; // the block length offered
};

} // namespace cospec
