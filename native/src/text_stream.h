// The reply's text as it grows token by token: where a stop string ends it, and how much of it
// is safe to show while it grows.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace cospec {

// The end of s[0..end) without the bytes of a UTF-8 character not yet complete there (a
// streamed text holds them back; a byte-level BPE tokenizer would write them as U+FFFD).
size_t utf8_complete_end(const std::string & s, size_t end);

class text_stream {
  public:
    // Writes into `text` (the result's), which it cuts where a stop string begins.
    text_stream(std::string & text, std::vector<std::string> stops);

    // Append a token's text. True where the text now holds a stop string: it is cut where the
    // first one begins, and the stop string is not part of it.
    bool append(std::string_view piece);

    // The bytes that became safe to show since the last call: not a possible start of a stop
    // string nor an incomplete UTF-8 character, or everything once the text has ended. Every
    // call's bytes concatenated are the final text: nothing shown is ever cut.
    std::string_view take(bool ended);

  private:
    size_t safe_end(bool ended) const;

    std::string & text;
    std::vector<std::string> stops;
    size_t sent = 0; // bytes already taken
};

} // namespace cospec
