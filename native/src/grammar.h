// A grammar the output follows: llama.cpp's grammar sampler, held in one state.
#pragma once

#include "llama.h"

#include <cstdint>
#include <memory>
#include <vector>

namespace cospec {

// One state of a grammar: after the emitted tokens, or a copy advanced along a block's drafted
// tokens. An empty state (no grammar) allows every token.
class grammar_state {
  public:
    grammar_state() = default;

    // The grammar (GBNF) over vocab from its start symbol root; false where it does not parse.
    bool parse(const llama_vocab * vocab, const char * grammar, const char * root);
    explicit operator bool() const { return sampler != nullptr; }
    grammar_state copy() const;

    // Whether the grammar allows tok next.
    bool allows(llama_token tok);
    // The row with every token it does not allow at -inf (the row itself when empty); nullptr
    // where it allows none of the n.
    const float * mask(const float * row, int32_t n);
    // The greedy choice: the argmax where allowed (the common case: one check), else the argmax of
    // the tokens allowed; -1 where none of the n is.
    llama_token greedy(const float * row, int32_t n);
    // Advance past tok, which it allows (an end-of-generation token ends the output: no change).
    void accept(const llama_vocab * vocab, llama_token tok);

  private:
    struct sampler_deleter {
        void operator()(llama_sampler * s) const { llama_sampler_free(s); }
    };
    std::unique_ptr<llama_sampler, sampler_deleter> sampler;
    // Candidates tried one by one before the whole vocabulary is masked (greedy): each check is
    // one token's, a mask is the vocabulary's.
    static constexpr int32_t GREEDY_CANDIDATES = 32;
    std::vector<llama_token_data> candidates;
    std::vector<float> masked;
    std::vector<int32_t> order;
};

} // namespace cospec
