// Which token a model's row gives, in one place: the repeat penalty over the history, the grammar's
// states (after the output, along a block's drafted tokens while drafting and while verifying),
// greedy or sampled choice, and the target's verdict at each verify position (lossless speculative
// sampling's acceptance test). Every draw comes off one random stream, in the order the loop asks,
// so a seed fixes the output whichever source drafted its blocks.
#pragma once

#include "grammar.h"
#include "sampling.h"

#include <cstdint>
#include <random>
#include <vector>

namespace cospec {

class token_chooser {
  public:
    // t_sample_ms: a running total the time of every choice is added to (a stats field).
    token_chooser(const sampler_config & cfg, uint64_t seed, float repeat_penalty, int32_t repeat_last_n,
                  double & t_sample_ms);

    // Below MIN_SAMPLING_TEMPERATURE, softmax(logits / T) is the argmax anyway, and 1 / T
    // overflows float (0 * inf turned the top logit into NaN and sampling into token 0).
    bool greedy() const { return is_greedy; }

    // The grammar (GBNF) the output follows, over vocab; false where it does not parse.
    bool parse_grammar(const llama_vocab * vocab, const char * grammar, const char * root);
    bool has_grammar() const { return static_cast<bool>(grammar); }
    // tok joined the output: the grammar's state moves past it.
    void accept(const llama_vocab * vocab, llama_token tok) { grammar.accept(vocab, tok); }

    // The output's next token from row (n logits) after seq: -1 where the grammar allows none.
    llama_token choose(const float * row, int32_t n, const std::vector<llama_token> & seq);

    // Drafting: begin_draft() starts the grammar's walk at the output's end; draft() chooses
    // the draft's token at block position i (after seq and drafted[0..i)) among the first
    // n_shared ids of its row (n_draft_vocab logits), with its sampling distribution in *q when
    // sampling (q: nullptr when greedy); -1: the draft declines (its top probability is under p_min, greedy only) or the
    // grammar allows none of its tokens. accept_drafted() moves the walk past the token.
    void begin_draft() { draft_grammar = grammar.copy(); }
    llama_token draft(const float * row, int32_t n_shared, int32_t n_draft_vocab, const std::vector<llama_token> & seq,
                      const std::vector<llama_token> & drafted, int32_t i, float p_min, std::vector<float> * q);
    void accept_drafted(const llama_vocab * vocab, llama_token tok) { draft_grammar.accept(vocab, tok); }

    // A draft of another vocabulary's own token: no penalty and no grammar (its tokens are not
    // the target's); -1 where it declines (p_min, greedy only).
    llama_token draft_free(const float * row, int32_t n, float p_min);

    // A proposal that arrived whole (the n-gram drafter's, a text draft's) cut before its first
    // token the grammar does not allow, or after an end of generation it allows.
    void trim(std::vector<llama_token> & proposal, const llama_vocab * vocab);

    // Verifying: begin_verify() starts the grammar's walk at the output's end; judge() gives the
    // target's token at block position j (row: its raw logits, n of them) after seq and
    // drafted[0..j), and whether drafted[j] is a mismatch (j < drafted.size()). Greedy: the
    // argmax. Sampling: accept drafted[j] with min(1, p/q), else a token of the residual
    // max(0, p - q); q: the draft's distribution there over its first q->size() ids, nullptr
    // for a token proposed with certainty (q = 1: accept with p, else sample p without it).
    // token -1: the grammar allows none. walk_accept() moves the walk past drafted[j].
    struct verdict {
        llama_token token;
        bool mismatch;
    };
    void begin_verify() { walk_grammar = grammar.copy(); }
    verdict judge(const float * row, int32_t n, const std::vector<llama_token> & seq,
                  const std::vector<llama_token> & drafted, int32_t j, const std::vector<float> * q);
    void walk_accept(const llama_vocab * vocab, llama_token tok) { walk_grammar.accept(vocab, tok); }

  private:
    sampler_config cfg;
    bool is_greedy;
    std::mt19937_64 rng;
    repeat_penalty penalty;
    double & t_sample_ms;
    grammar_state grammar;       // after the output
    grammar_state draft_grammar; // along the block being drafted
    grammar_state walk_grammar;  // along the block being verified
    std::vector<float> probs;    // scratch: a sampling distribution
    std::vector<float> residual;
};

} // namespace cospec
