// Drafting across vocabularies: a draft model of another family writes text, not the target's
// tokens. The bridge keeps the reply as the target wrote it, in bytes, and re-encodes it both
// ways:
//   - the reply so far into the draft's tokens, from a settled point a few draft tokens back (the
//     tokens at the end may merge otherwise once more text follows), so that the draft reads the
//     reply as its own tokenizer would have written it;
//   - the draft's proposal into the target's tokens, after a look-behind of the target's last
//     tokens, so that the proposal's first token starts where the target's text ends and merges
//     as the target's tokenizer merges.
// The target verifies whatever comes out, so the conversion decides only how much is accepted,
// never what the output is (as Hugging Face's universal assisted generation and llama.cpp's
// detokenize-and-retokenize drafting).
#pragma once

#include "llama.h"

#include <cstdint>
#include <string>
#include <vector>

namespace cospec {

// Whether `to` writes every text `from` writes: a probe of spaces, newlines, digits, punctuation,
// accented and CJK characters and an emoji, written in `from`'s tokens, comes back byte for byte
// through `to`'s. why: what differs, where it does not.
bool texts_round_trip(const llama_vocab * from, const llama_vocab * to, std::string & why);

// Bytes of a token's text, and a text in a vocabulary's tokens (no BOS). With `special`, control
// tokens are written as their text and such text is read as them (a prompt's chat markers);
// without, they write nothing and read as plain text (a reply's).
std::string token_bytes(const llama_vocab * vocab, llama_token token, bool special = false);
std::vector<llama_token> encode(const llama_vocab * vocab, const std::string & text, bool special = false);

class text_bridge {
  public:
    // Draft tokens re-encoded behind the end each time: how far back a merge may reach.
    static constexpr int32_t DRAFT_LOOK_BEHIND = 4;
    // Target tokens the proposal is encoded after, at most.
    static constexpr int32_t TARGET_LOOK_BEHIND = 4;

    text_bridge(const llama_vocab * target, const llama_vocab * draft) : target(target), draft(draft) {}

    // Begin a reply: the draft reads draft_prompt (its own rendering of the conversation, or the
    // target prompt's text in its tokens) and then the reply.
    void begin(const std::vector<llama_token> & draft_prompt);
    // A target token joined the reply.
    void append_target(llama_token token);
    // The draft's tokens for its prompt and the reply so far, but for the bytes held back (an
    // incomplete UTF-8 character at the reply's end).
    const std::vector<llama_token> & draft_tokens();
    // The draft's proposal (its tokens, continuing draft_tokens()) in target tokens continuing the
    // reply; empty where the proposal's text does not continue the reply (it parts from the bytes
    // held back) or adds no complete character.
    void to_target(const llama_token * proposal, int32_t n, std::vector<llama_token> & out) const;
    // Whether the proposal's text parts from the bytes held back (no longer one continues the reply).
    bool parts_from_reply(const llama_token * proposal, int32_t n) const;

    // Where each target token of a converted proposal sits among the draft's: what an arbiter
    // reads of the draft at a target position. covering[i]: the proposal token whose text holds
    // the first byte of out[i]; starts_there[i]: out[i] begins where that token begins.
    struct alignment {
        std::vector<int32_t> covering;
        std::vector<uint8_t> starts_there;
    };
    alignment align(const llama_token * proposal, int32_t n, const std::vector<llama_token> & out) const;

    const std::string & reply() const { return reply_text; }

  private:
    // A proposal's bytes, and whether such bytes part from the ones held back from the draft.
    std::string proposal_text(const llama_token * proposal, int32_t n) const;
    bool parts_from_held(const std::string & text) const;

    const llama_vocab * target;
    const llama_vocab * draft;
    std::string reply_text;                // the reply's bytes, as the target wrote them
    std::vector<llama_token> target_reply; // the target's reply tokens
    std::vector<size_t> target_ends;       // reply bytes after each of them
    size_t n_draft_prompt = 0;
    std::vector<llama_token> draft_seq;    // the draft's prompt, then the reply in its tokens
    std::vector<size_t> draft_ends;        // reply bytes after each draft reply token
    size_t draft_encoded = 0;              // reply bytes draft_seq holds
};

} // namespace cospec
