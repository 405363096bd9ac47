// What an embedding gate reads of a prompt: the draft model's final hidden state at the prompt's
// last token, L2-normalised: the model about to answer, which reads a question asking for a short
// answer apart from a request for prose better than a mean over the prompt does (a chat template's
// system prompt dilutes a mean; bench/gate_leave_family_out.py). The draft, because an arbiter is
// bound to it (its fingerprint) while it may serve several targets; its own tokens of the
// prompt's text where the vocabularies differ.
#pragma once

#include "llama.h"

#include <cstdint>
#include <vector>

struct cospec_engine;

namespace cospec {

// The prompt's last tokens the draft reads for it: a question sits at the end of its chat turn.
constexpr int32_t PROMPT_EMBEDDING_TOKENS = 256;

class prompt_embedder {
  public:
    ~prompt_embedder();
    // out: n_embd floats. The caller holds the engine (a generation, or the engine's lock).
    int32_t embed(cospec_engine & e, const llama_token * prompt, int32_t n_prompt, std::vector<float> & out);

  private:
    llama_context * ctx = nullptr; // the draft model's, embeddings on, created on first use
    llama_batch batch {};
};

} // namespace cospec
