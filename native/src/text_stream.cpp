#include "text_stream.h"

#include <algorithm>
#include <utility>

namespace cospec {

size_t utf8_complete_end(const std::string & s, size_t end) {
    for (size_t k = 1; k <= 4 && k <= end; ++k) {
        const unsigned char c = (unsigned char) s[end - k];
        if ((c & 0xC0) == 0x80) {
            continue; // continuation byte: keep looking for the lead byte
        }
        const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > k ? end - k : end;
    }
    return end;
}

text_stream::text_stream(std::string & text, std::vector<std::string> stop_strings) : text(text) {
    for (auto & s : stop_strings) {
        if (!s.empty()) {
            stops.push_back(std::move(s));
        }
    }
}

bool text_stream::append(std::string_view piece) {
    text.append(piece.data(), piece.size());
    // A stop string can only begin in the part not yet taken: safe_end holds back exactly the
    // bytes that could still start one.
    size_t first = std::string::npos;
    for (const auto & s : stops) {
        first = std::min(first, text.find(s, sent));
    }
    if (first == std::string::npos) {
        return false;
    }
    text.resize(first);
    return true;
}

size_t text_stream::safe_end(bool ended) const {
    const size_t size = text.size();
    if (ended) {
        return size;
    }
    size_t hold = 0;
    for (const auto & s : stops) {
        for (size_t k = std::min(s.size() - 1, size - sent); k > hold; --k) {
            if (text.compare(size - k, k, s, 0, k) == 0) {
                hold = k;
                break;
            }
        }
    }
    return std::max(sent, utf8_complete_end(text, size - hold));
}

std::string_view text_stream::take(bool ended) {
    const size_t end = safe_end(ended);
    const std::string_view out(text.data() + sent, end - sent);
    sent = end;
    return out;
}

} // namespace cospec
