#include "text_bridge.h"
#include "text_stream.h"

#include <algorithm>
#include <stdexcept>

namespace cospec {

namespace {
// What a pair must both write: spaces and indentation, newlines, digits, punctuation, accented,
// CJK and Cyrillic letters, an emoji.
const char * const ROUND_TRIP_PROBE = "Hello, world!  Two spaces,\ttab;\n\nnew lines 0123456789 (x+y)*z=\"q\" "
                                      "caf\xc3\xa9 na\xc3\xafve \xe4\xb8\xad\xe6\x96\x87 \xd0\x9f\xd1\x80\xd0\xb8 "
                                      "\xf0\x9f\x99\x82 end.";

std::string shown(const std::string & s) {
    std::string out;
    for (const char c : s.substr(0, 40)) {
        out += c == '\n' ? std::string("\\n") : c == '\t' ? std::string("\\t") : std::string(1, c);
    }
    return out;
}
} // namespace

std::string token_bytes(const llama_vocab * vocab, llama_token token, bool special) {
    char buf[256];
    const int32_t n = llama_token_to_piece(vocab, token, buf, sizeof(buf), 0, special);
    if (n >= 0) {
        return std::string(buf, (size_t) n);
    }
    std::string big((size_t) -n, '\0');
    const int32_t m = llama_token_to_piece(vocab, token, big.data(), (int32_t) big.size(), 0, special);
    big.resize((size_t) std::max(m, 0));
    return big;
}

std::vector<llama_token> encode(const llama_vocab * vocab, const std::string & text, bool special) {
    std::vector<llama_token> out(text.size() + 2);
    int32_t n = llama_tokenize(vocab, text.data(), (int32_t) text.size(), out.data(), (int32_t) out.size(), false, special);
    if (n < 0) {
        out.resize((size_t) -n);
        n = llama_tokenize(vocab, text.data(), (int32_t) text.size(), out.data(), (int32_t) out.size(), false, special);
    }
    out.resize((size_t) std::max(n, 0));
    return out;
}

bool texts_round_trip(const llama_vocab * from, const llama_vocab * to, std::string & why) {
    // A vocabulary without a tokenizer writes nothing (and llama.cpp aborts on tokenizing with it).
    if (llama_vocab_type(from) == LLAMA_VOCAB_TYPE_NONE || llama_vocab_type(to) == LLAMA_VOCAB_TYPE_NONE) {
        why = "a vocabulary without a tokenizer writes no text";
        return false;
    }
    std::string written, back;
    try {
        for (const llama_token t : encode(from, ROUND_TRIP_PROBE)) {
            written += token_bytes(from, t);
        }
        for (const llama_token t : encode(to, written)) {
            back += token_bytes(to, t);
        }
    } catch (const std::exception & ex) {
        why = std::string("a tokenizer failed on the probe text: ") + ex.what(); // e.g. a vocabulary without byte tokens
        return false;
    }
    if (back == written) {
        return true;
    }
    size_t at = 0;
    while (at < std::min(back.size(), written.size()) && back[at] == written[at]) {
        at += 1;
    }
    why = "'" + shown(written.substr(at)) + "' comes back as '" + shown(back.substr(at)) + "'";
    return false;
}

void text_bridge::begin(const std::vector<llama_token> & draft_prompt) {
    reply_text.clear();
    target_reply.clear();
    target_ends.clear();
    draft_seq = draft_prompt;
    n_draft_prompt = draft_prompt.size();
    draft_ends.clear();
    draft_encoded = 0;
}

void text_bridge::append_target(llama_token token) {
    reply_text += token_bytes(target, token);
    target_reply.push_back(token);
    target_ends.push_back(reply_text.size());
}

const std::vector<llama_token> & text_bridge::draft_tokens() {
    const size_t end = utf8_complete_end(reply_text, reply_text.size());
    if (end == draft_encoded) {
        return draft_seq;
    }
    // Keep the draft tokens up to DRAFT_LOOK_BEHIND before the end; encode the rest again, from a
    // character's start (a byte-level tokenizer may end a token inside a character).
    size_t keep = draft_ends.size() > (size_t) DRAFT_LOOK_BEHIND ? draft_ends.size() - DRAFT_LOOK_BEHIND : 0;
    while (keep > 0 && ((unsigned char) reply_text[draft_ends[keep - 1]] & 0xC0) == 0x80) {
        keep -= 1;
    }
    const size_t from = keep > 0 ? draft_ends[keep - 1] : 0;
    draft_seq.resize(n_draft_prompt + keep);
    draft_ends.resize(keep);
    const std::vector<llama_token> tail = encode(draft, reply_text.substr(from, end - from));
    size_t at = from;
    for (const llama_token t : tail) {
        at += token_bytes(draft, t).size();
        draft_seq.push_back(t);
        draft_ends.push_back(std::min(at, end));
    }
    if (at != end) {
        // The tokenizer normalised the text: only the chunk's start and end are known boundaries.
        std::fill(draft_ends.begin() + (ptrdiff_t) keep, draft_ends.end(), from);
        if (!draft_ends.empty()) {
            draft_ends.back() = end;
        }
    }
    draft_encoded = end;
    return draft_seq;
}

text_bridge::alignment text_bridge::align(const llama_token * proposal, int32_t n,
                                           const std::vector<llama_token> & out) const {
    // Offsets from the reply's end: the proposal begins with the bytes held back from the draft.
    std::vector<int64_t> starts((size_t) n + 1);
    starts[0] = -(int64_t) (reply_text.size() - draft_encoded);
    for (int32_t j = 0; j < n; ++j) {
        starts[j + 1] = starts[j] + (int64_t) token_bytes(draft, proposal[j]).size();
    }
    alignment a;
    int64_t at = 0;
    int32_t j = 0;
    for (const llama_token t : out) {
        while (j + 1 < n && starts[j + 1] <= at) {
            j += 1;
        }
        a.covering.push_back(j);
        a.starts_there.push_back(starts[j] == at);
        at += (int64_t) token_bytes(target, t).size();
    }
    return a;
}

std::string text_bridge::proposal_text(const llama_token * proposal, int32_t n) const {
    std::string text;
    for (int32_t i = 0; i < n; ++i) {
        text += token_bytes(draft, proposal[i]);
    }
    return text;
}

bool text_bridge::parts_from_held(const std::string & text) const {
    const size_t n_held = reply_text.size() - draft_encoded;
    const size_t common = std::min(text.size(), n_held);
    return reply_text.compare(draft_encoded, common, text, 0, common) != 0;
}

bool text_bridge::parts_from_reply(const llama_token * proposal, int32_t n) const {
    return parts_from_held(proposal_text(proposal, n));
}

void text_bridge::to_target(const llama_token * proposal, int32_t n, std::vector<llama_token> & out) const {
    out.clear();
    const std::string text = proposal_text(proposal, n);
    // The draft read the reply without its held-back bytes: its text must begin with them.
    const size_t n_held = reply_text.size() - draft_encoded;
    if (text.size() < n_held || parts_from_held(text)) {
        return;
    }
    const std::string reply_and_new = reply_text + text.substr(n_held);
    const size_t end = utf8_complete_end(reply_and_new, reply_and_new.size());
    if (end <= reply_text.size()) {
        return; // no character completed past the reply's end
    }
    const std::string added = reply_and_new.substr(reply_text.size(), end - reply_text.size());
    // After the longest look-behind whose target tokens come out the same: the proposal's tokens
    // then merge with the reply's end as the target's own would.
    const int32_t n_reply = (int32_t) target_reply.size();
    for (int32_t m = std::min(TARGET_LOOK_BEHIND, n_reply); m >= 1; --m) {
        const size_t from = n_reply - m > 0 ? target_ends[n_reply - m - 1] : 0;
        const std::vector<llama_token> tokens = encode(target, reply_text.substr(from) + added);
        if (tokens.size() > (size_t) m && std::equal(tokens.begin(), tokens.begin() + m, target_reply.end() - m)) {
            out.assign(tokens.begin() + m, tokens.end());
            return;
        }
    }
    out = encode(target, added);
}

} // namespace cospec
