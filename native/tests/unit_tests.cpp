// Unit tests of the generation loop's parts that need no model: the text stream (stop strings
// across token boundaries, UTF-8 hold-back) and token choice (the order of top-k, top-p, min-p and
// temperature; the repeat penalty). tests/test_native_units.py builds and runs this program.
#include "sampling.h"
#include "text_stream.h"

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace {

int failures = 0;
int checks = 0;

#define CHECK(cond)                                                                 \
    do {                                                                            \
        ++checks;                                                                   \
        if (!(cond)) {                                                              \
            ++failures;                                                             \
            std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                           \
    } while (0)

bool near(double a, double b, double tol = 1e-5) {
    return std::fabs(a - b) <= tol;
}

// Feed `pieces` to a stream; the concatenated takes (one per piece while it runs, one at the end).
struct streamed {
    std::string text;    // the final text
    std::string shown;   // every take concatenated
    std::vector<std::string> takes;
    int stopped_at = -1; // the piece whose text completed a stop string
};

streamed run_stream(const std::vector<std::string> & pieces, const std::vector<std::string> & stops) {
    streamed out;
    cospec::text_stream stream(out.text, stops);
    for (size_t i = 0; i < pieces.size(); ++i) {
        const bool stopped = stream.append(pieces[i]);
        out.takes.emplace_back(stream.take(stopped));
        out.shown += out.takes.back();
        if (stopped) {
            out.stopped_at = (int) i;
            return out;
        }
    }
    out.takes.emplace_back(stream.take(true));
    out.shown += out.takes.back();
    return out;
}

void test_a_stop_string_across_token_boundaries() {
    const streamed s = run_stream({"The answer", " is 4", "2.\nQ", "uestion: why"}, {"\nQuestion:"});
    CHECK(s.stopped_at == 3);
    CHECK(s.text == "The answer is 42.");
    CHECK(s.shown == s.text); // the held-back "\nQ" was never shown
    CHECK(s.takes[2] == "2."); // ".\nQ" could begin the stop string: held back
}

void test_a_possible_start_that_does_not_complete_is_released() {
    const streamed s = run_stream({"ab", "c", "x"}, {"cd"});
    CHECK(s.stopped_at == -1);
    CHECK(s.takes[0] == "ab" && s.takes[1].empty() && s.takes[2] == "cx");
    CHECK(s.text == "abcx" && s.shown == s.text);
}

void test_the_first_stop_string_to_complete_ends_the_text() {
    // "bc" completes before "abcd", which began earlier: the text ends where "bc" begins.
    const streamed s = run_stream({"a", "b", "c", "d"}, {"abcd", "bc"});
    CHECK(s.stopped_at == 2);
    CHECK(s.text == "a" && s.shown == "a");
}

void test_an_incomplete_utf8_character_is_held_back() {
    // "é" (C3 A9) and "€" (E2 82 AC) split over tokens.
    const streamed s = run_stream({"caf\xC3", "\xA9 ", "\xE2\x82", "\xAC"}, {});
    CHECK(s.takes[0] == "caf");
    CHECK(s.takes[1] == "\xC3\xA9 ");
    CHECK(s.takes[2].empty());
    CHECK(s.takes[3] == "\xE2\x82\xAC");
    CHECK(s.shown == "caf\xC3\xA9 \xE2\x82\xAC");
    CHECK(cospec::utf8_complete_end("ab\xF0\x9F\x98", 5) == 2); // 3 of an emoji's 4 bytes
    CHECK(cospec::utf8_complete_end("ab\xF0\x9F\x98\x80", 6) == 6);
}

void test_a_stop_string_inside_a_multibyte_text() {
    const streamed s = run_stream({"na\xC3", "\xAFve \xE2\x80", "\x94 end"}, {"\xE2\x80\x94"}); // an em dash
    CHECK(s.stopped_at == 2);
    CHECK(s.text == "na\xC3\xAFve " && s.shown == s.text);
}

void test_empty_stop_strings_stop_nothing() {
    const streamed s = run_stream({"a", "b"}, {"", ""});
    CHECK(s.stopped_at == -1 && s.text == "ab" && s.takes[0] == "a");
}

// Random texts over a small alphabet, cut at random points: the stream's text is what a
// search of the whole text after every piece finds, and nothing shown is ever cut.
void test_random_splits_against_a_plain_search() {
    std::mt19937 rng(7);
    const std::string alphabet = "ab\xC3\xA9 ";
    for (int round = 0; round < 3000; ++round) {
        std::string whole;
        const int len = 1 + (int) (rng() % 24);
        for (int i = 0; i < len; ++i) {
            whole += alphabet[rng() % alphabet.size()];
        }
        std::vector<std::string> stops;
        for (int i = 0, n = 1 + (int) (rng() % 2); i < n; ++i) {
            std::string stop;
            for (int j = 0, m = 1 + (int) (rng() % 3); j < m; ++j) {
                stop += alphabet[rng() % 3];
            }
            stops.push_back(stop);
        }
        std::vector<std::string> pieces;
        for (size_t at = 0; at < whole.size();) {
            const size_t n = std::min(whole.size() - at, (size_t) (1 + rng() % 4));
            pieces.push_back(whole.substr(at, n));
            at += n;
        }
        // Reference: after each piece, the earliest occurrence of any stop string in the text so far.
        std::string expected, so_far;
        bool ended = false;
        for (const auto & piece : pieces) {
            so_far += piece;
            size_t first = std::string::npos;
            for (const auto & stop : stops) {
                first = std::min(first, so_far.find(stop));
            }
            if (first != std::string::npos) {
                expected = so_far.substr(0, first);
                ended = true;
                break;
            }
        }
        if (!ended) {
            expected = so_far;
        }
        const streamed s = run_stream(pieces, stops);
        CHECK(s.text == expected);
        CHECK(s.shown == s.text);
        if (s.text != expected || s.shown != s.text) {
            std::fprintf(stderr, "  round %d: whole '%s'\n", round, whole.c_str());
            return;
        }
    }
}

void test_sampling_cuts_on_the_models_own_probabilities_then_applies_the_temperature() {
    const std::vector<float> logits = {std::log(0.5f), std::log(0.2f), std::log(0.15f), std::log(0.1f),
                                       std::log(0.05f)};
    std::vector<float> probs;
    cospec::sampler_config cfg;
    // top-k 3 leaves 0.5, 0.2, 0.15 (renormalised: 0.588, 0.235, 0.176); top-p 0.8 then keeps two;
    // temperature 2 shapes those two: sqrt(0.5) : sqrt(0.2). Were the temperature first, top-p
    // on the flattened distribution would keep all three.
    cfg.temperature = 2.0f;
    cfg.top_k = 3;
    cfg.top_p = 0.8f;
    cospec::sampling_probs(logits.data(), 5, cfg, probs);
    const double a = std::sqrt(0.5), b = std::sqrt(0.2);
    CHECK(near(probs[0], a / (a + b)) && near(probs[1], b / (a + b)));
    CHECK(probs[2] == 0.0f && probs[3] == 0.0f && probs[4] == 0.0f);
    // min-p 0.25 of the top's own probability (0.125) keeps 0.5, 0.2, 0.15; temperature 4 after.
    cfg = {};
    cfg.temperature = 4.0f;
    cfg.min_p = 0.25f;
    cospec::sampling_probs(logits.data(), 5, cfg, probs);
    const double w0 = std::pow(0.5, 0.25), w1 = std::pow(0.2, 0.25), w2 = std::pow(0.15, 0.25);
    CHECK(near(probs[0], w0 / (w0 + w1 + w2)) && near(probs[2], w2 / (w0 + w1 + w2)));
    CHECK(probs[3] == 0.0f && probs[4] == 0.0f);
    // No cut: softmax at the temperature.
    cfg = {};
    cfg.temperature = 1.0f;
    cospec::sampling_probs(logits.data(), 5, cfg, probs);
    CHECK(near(probs[0], 0.5) && near(probs[4], 0.05));
}

void test_the_repeat_penalty_divides_positive_and_multiplies_negative_logits_once() {
    const std::vector<float> logits = {2.0f, -2.0f, 0.5f, 3.0f};
    std::vector<int32_t> history = {0, 1, 1, 7, -1, 0}; // repeats count once; ids outside the vocabulary are ignored
    std::vector<float> out;
    cospec::apply_repeat_penalty(logits.data(), 4, history, 2.0f, out);
    CHECK(out == std::vector<float>({1.0f, -4.0f, 0.5f, 3.0f}));
}

void test_the_penalty_window_spans_the_sequence_and_the_blocks_drafted_tokens() {
    const std::vector<float> logits = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
    const std::vector<int32_t> seq = {1, 2, 3}, drafted = {4, 5};
    cospec::repeat_penalty penalty(2.0f, 2);
    const float * at1 = penalty.apply(logits.data(), 6, seq, drafted, 1); // the last 2 of 1 2 3 | 4: 3 and 4
    CHECK(std::vector<float>(at1, at1 + 6) == std::vector<float>({1.0f, 1.0f, 1.0f, 0.5f, 0.5f, 1.0f}));
    cospec::repeat_penalty whole(2.0f, -1);
    const float * all = whole.apply(logits.data(), 6, seq, drafted, 2); // -1: every token, 1 to 5
    CHECK(std::vector<float>(all, all + 6) == std::vector<float>({1.0f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f}));
    cospec::repeat_penalty off(1.0f, 64);
    CHECK(!off.on() && off.apply(logits.data(), 6, seq, drafted, 2) == logits.data());
}

void test_logprobs_list_the_likeliest_first_and_pad_a_small_vocabulary() {
    const std::vector<float> logits = {0.0f, 2.0f, 1.0f, 2.0f};
    std::vector<cospec_token_logprob> out;
    cospec::token_logprobs(logits.data(), 4, 2, 3, out);
    const double lse = std::log(1.0 + 2.0 * std::exp(2.0) + std::exp(1.0));
    CHECK(out.size() == 4 && out[0].token == 2 && near(out[0].logprob, 1.0 - lse));
    CHECK(out[1].token == 1 && out[2].token == 3 && out[3].token == 2); // equal logits: the lower id first
    CHECK(near(out[1].logprob, 2.0 - lse) && near(out[3].logprob, 1.0 - lse));
    out.clear();
    cospec::token_logprobs(logits.data(), 4, 0, 6, out);
    CHECK(out.size() == 7 && out[5].token == -1 && out[6].token == -1 && std::isinf(out[6].logprob));
    CHECK(out[4].token == 0);
}

void test_argmax_takes_the_first_of_equals() {
    const std::vector<float> logits = {1.0f, 3.0f, 3.0f, 2.0f};
    CHECK(cospec::argmax(logits.data(), 4) == 1);
}

} // namespace

int main() {
    test_a_stop_string_across_token_boundaries();
    test_a_possible_start_that_does_not_complete_is_released();
    test_the_first_stop_string_to_complete_ends_the_text();
    test_an_incomplete_utf8_character_is_held_back();
    test_a_stop_string_inside_a_multibyte_text();
    test_empty_stop_strings_stop_nothing();
    test_random_splits_against_a_plain_search();
    test_sampling_cuts_on_the_models_own_probabilities_then_applies_the_temperature();
    test_the_repeat_penalty_divides_positive_and_multiplies_negative_logits_once();
    test_the_penalty_window_spans_the_sequence_and_the_blocks_drafted_tokens();
    test_logprobs_list_the_likeliest_first_and_pad_a_small_vocabulary();
    test_argmax_takes_the_first_of_equals();
    std::printf("%d checks, %d failed\n", checks, failures);
    return failures == 0 ? 0 : 1;
}
