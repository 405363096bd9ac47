// Unit tests of the generation loop's parts that need no model: the text stream (stop strings
// across token boundaries, UTF-8 hold-back) and token choice (the order of top-k, top-p, min-p and
// temperature; the repeat penalty; the token chooser's choices and verdicts without a grammar).
// tests/test_native_units.py builds and runs this program.
#include "sampling.h"
#include "text_stream.h"
#include "token_choice.h"

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


cospec::sampler_config at_temperature(float t) {
    cospec::sampler_config cfg;
    cfg.temperature = t;
    return cfg;
}

void test_the_greedy_choice_is_the_argmax_of_the_penalised_row() {
    // Token 0 leads the raw row, but the penalty over the last 2 tokens (0 and 3) halves it.
    const std::vector<float> row = {4.0f, 3.0f, 1.0f, 3.5f};
    const std::vector<int32_t> seq = {2, 0, 3};
    double t_ms = 0.0;
    cospec::token_chooser penalised(at_temperature(0.0f), 1, 2.0f, 2, t_ms);
    CHECK(penalised.greedy());
    CHECK(penalised.choose(row.data(), 4, seq) == 1);
    cospec::token_chooser plain(at_temperature(0.0f), 1, 1.0f, 64, t_ms);
    CHECK(plain.choose(row.data(), 4, seq) == 0);
    // The window is 2 tokens: token 2, three back, is not penalised.
    cospec::token_chooser short_window(at_temperature(0.0f), 1, 100.0f, 2, t_ms);
    const std::vector<float> flat = {1.0f, 1.0f, 1.5f, 1.0f};
    CHECK(short_window.choose(flat.data(), 4, seq) == 2);
    CHECK(t_ms >= 0.0);
}

void test_a_greedy_verdict_is_the_argmax_of_the_row_penalised_for_the_drafted_tokens_before_it() {
    // At position 1 the history is seq + drafted[0] = 3: token 3 leads the raw row but is penalised.
    const std::vector<float> row = {0.0f, 2.0f, 0.5f, 3.0f};
    const std::vector<int32_t> seq = {0}, drafted = {3, 3};
    double t_ms = 0.0;
    cospec::token_chooser chooser(at_temperature(0.0f), 1, 2.0f, -1, t_ms);
    chooser.begin_verify();
    const cospec::token_chooser::verdict at0 = chooser.judge(row.data(), 4, seq, drafted, 0, nullptr);
    CHECK(at0.token == 3 && !at0.mismatch); // nothing drafted before position 0: the raw argmax
    const cospec::token_chooser::verdict at1 = chooser.judge(row.data(), 4, seq, drafted, 1, nullptr);
    CHECK(at1.token == 1 && at1.mismatch);
    const cospec::token_chooser::verdict bonus = chooser.judge(row.data(), 4, seq, drafted, 2, nullptr);
    CHECK(bonus.token == 1 && !bonus.mismatch); // past the block: no draft token to mismatch
}

void test_seeded_sampling_is_reproducible_and_follows_the_distribution() {
    const std::vector<float> row = {std::log(0.6f), std::log(0.3f), std::log(0.1f)};
    const std::vector<int32_t> seq = {};
    double t_ms = 0.0;
    cospec::token_chooser a(at_temperature(1.0f), 42, 1.0f, 64, t_ms), b(at_temperature(1.0f), 42, 1.0f, 64, t_ms);
    cospec::token_chooser other_seed(at_temperature(1.0f), 43, 1.0f, 64, t_ms);
    CHECK(!a.greedy());
    std::vector<int32_t> from_a, from_b, from_other;
    int32_t counts[3] = {0, 0, 0};
    const int n = 20000;
    for (int i = 0; i < n; ++i) {
        from_a.push_back(a.choose(row.data(), 3, seq));
        from_b.push_back(b.choose(row.data(), 3, seq));
        from_other.push_back(other_seed.choose(row.data(), 3, seq));
        counts[from_a.back()] += 1;
    }
    CHECK(from_a == from_b);
    CHECK(from_a != from_other);
    CHECK(near(counts[0] / (double) n, 0.6, 0.02) && near(counts[1] / (double) n, 0.3, 0.02) &&
          near(counts[2] / (double) n, 0.1, 0.02));
}

void test_a_certain_proposal_is_accepted_with_the_targets_probability_and_replaced_from_the_rest() {
    // The target gives the proposed token 1 a probability of 0.25: accepted about a quarter of the
    // time; refused, the token comes from p without it (0 and 2 at 0.5 : 0.25).
    const std::vector<float> row = {std::log(0.5f), std::log(0.25f), std::log(0.25f)};
    const std::vector<int32_t> seq = {}, drafted = {1};
    double t_ms = 0.0;
    cospec::token_chooser chooser(at_temperature(1.0f), 7, 1.0f, 64, t_ms);
    int32_t accepted = 0, replaced[3] = {0, 0, 0};
    const int n = 20000;
    for (int i = 0; i < n; ++i) {
        chooser.begin_verify();
        const cospec::token_chooser::verdict v = chooser.judge(row.data(), 3, seq, drafted, 0, nullptr);
        CHECK(v.mismatch == (v.token != 1));
        if (v.mismatch) {
            replaced[v.token] += 1;
        } else {
            accepted += 1;
        }
    }
    CHECK(near(accepted / (double) n, 0.25, 0.02));
    CHECK(replaced[1] == 0 && near(replaced[0] / (double) (n - accepted), 2.0 / 3.0, 0.02));
}

void test_a_drafted_token_with_its_q_is_judged_losslessly() {
    // p = (0.5, 0.3, 0.2), the draft's q = (0.2, 0.6, 0.2) over the same ids. The output's token
    // must follow p whatever the draft drew: draw d from q, judge it, count the outcome.
    const std::vector<float> row = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
    const std::vector<float> q = {0.2f, 0.6f, 0.2f};
    const std::vector<int32_t> seq = {};
    double t_ms = 0.0;
    cospec::token_chooser chooser(at_temperature(1.0f), 11, 1.0f, 64, t_ms);
    std::mt19937_64 draw(5);
    int32_t out[3] = {0, 0, 0};
    const int n = 40000;
    for (int i = 0; i < n; ++i) {
        const std::vector<int32_t> drafted = {cospec::sample_from(q, draw)};
        chooser.begin_verify();
        const cospec::token_chooser::verdict v = chooser.judge(row.data(), 3, seq, drafted, 0, &q);
        CHECK(v.mismatch == (v.token != drafted[0]));
        out[v.token] += 1;
    }
    CHECK(near(out[0] / (double) n, 0.5, 0.015) && near(out[1] / (double) n, 0.3, 0.015) &&
          near(out[2] / (double) n, 0.2, 0.015));
}

void test_the_draft_declines_below_p_min_and_drafts_among_the_shared_ids() {
    // The draft's vocabulary is 4 tokens, of which the target shares the first 3: its top token
    // (3) is not one the target has, so the greedy draft takes the best of the first 3.
    const std::vector<float> row = {1.0f, 2.0f, 0.0f, 5.0f};
    const std::vector<int32_t> seq = {}, drafted = {};
    double t_ms = 0.0;
    cospec::token_chooser chooser(at_temperature(0.0f), 1, 1.0f, 64, t_ms);
    chooser.begin_draft();
    CHECK(chooser.draft(row.data(), 3, 4, seq, drafted, 0, 0.0f, nullptr) == 1);
    CHECK(chooser.draft(row.data(), 3, 4, seq, drafted, 0, 0.99f, nullptr) == -1); // top probability ~0.93
    CHECK(chooser.draft_free(row.data(), 4, 0.0f) == 3);
    CHECK(chooser.draft_free(row.data(), 4, 0.99f) == -1);
    // Sampling never declines, and leaves its distribution over the shared ids in q.
    cospec::token_chooser sampled(at_temperature(1.0f), 1, 1.0f, 64, t_ms);
    std::vector<float> q;
    sampled.begin_draft();
    const int32_t d = sampled.draft(row.data(), 3, 4, seq, drafted, 0, 0.99f, &q);
    CHECK(d >= 0 && d < 3 && q.size() == 3 && near(q[1] / q[0], std::exp(1.0), 1e-4));
}

void test_no_grammar_trims_nothing() {
    std::vector<int32_t> proposal = {5, 6, 7};
    double t_ms = 0.0;
    cospec::token_chooser chooser(at_temperature(0.0f), 1, 1.0f, 64, t_ms);
    CHECK(!chooser.has_grammar());
    chooser.trim(proposal, nullptr);
    CHECK(proposal == std::vector<int32_t>({5, 6, 7}));
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
    test_the_greedy_choice_is_the_argmax_of_the_penalised_row();
    test_a_greedy_verdict_is_the_argmax_of_the_row_penalised_for_the_drafted_tokens_before_it();
    test_seeded_sampling_is_reproducible_and_follows_the_distribution();
    test_a_certain_proposal_is_accepted_with_the_targets_probability_and_replaced_from_the_rest();
    test_a_drafted_token_with_its_q_is_judged_losslessly();
    test_the_draft_declines_below_p_min_and_drafts_among_the_shared_ids();
    test_no_grammar_trims_nothing();
    std::printf("%d checks, %d failed\n", checks, failures);
    return failures == 0 ? 0 : 1;
}
