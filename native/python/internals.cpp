// cospec_local._cospec_internals: parts of the engine that cospec.h does not declare, bound for
// the tests alone, so that their behaviour can be checked on crafted inputs: the n-gram drafter's
// proposals on chosen token sequences, the text bridge between two real vocabularies, the UTF-8
// hold-back, and the block-length tuner replayed on chosen timings. The public module, _cospec,
// binds cospec.h only.
#include "cospec.h"
#include "../src/draft_tuner.h"
#include "../src/ngram_drafter.h"
#include "../src/text_bridge.h"
#include "../src/text_stream.h"
#include "../src/weight_repacking.h"

#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

namespace py = pybind11;

PYBIND11_MODULE(_cospec_internals, m) {
    m.doc() = "the engine's internals, for tests (cospec.h is the public API: cospec_local._cospec)";
    // The n-gram drafter, on crafted token sequences.
    py::class_<cospec::ngram_drafter>(m, "NgramDrafter")
        .def(py::init<>())
        .def("begin", [](cospec::ngram_drafter & d, const std::vector<llama_token> & prompt) { d.begin(prompt.data(), prompt.size()); },
             py::arg("prompt"))
        .def("append", &cospec::ngram_drafter::append, py::arg("token"))
        .def("propose", [](cospec::ngram_drafter & d, int32_t k) {
                 std::vector<llama_token> out;
                 d.propose(k, out);
                 return out;
             }, py::arg("k"))
        .def("feedback", &cospec::ngram_drafter::feedback, py::arg("n_verified"), py::arg("n_accepted"))
        .def_property_readonly("acceptance", &cospec::ngram_drafter::acceptance)
        .def("bucket_acceptance", &cospec::ngram_drafter::bucket_acceptance, py::arg("bucket"))
        .def_static("support_bucket", &cospec::ngram_drafter::support_bucket, py::arg("match"))
        .def("clear", &cospec::ngram_drafter::clear)
        .def_property_readonly("pool_size", &cospec::ngram_drafter::pool_size);

    // Two models' vocabularies (loaded vocabulary-only) and the bridge between them.
    struct bridge_pair {
        llama_model * target = nullptr;
        llama_model * draft = nullptr;
        std::unique_ptr<cospec::text_bridge> bridge;
        ~bridge_pair() {
            if (target) llama_model_free(target);
            if (draft) llama_model_free(draft);
        }
    };
    py::class_<bridge_pair>(m, "TextBridge")
        .def(py::init([](const std::string & target_path, const std::string & draft_path) {
                 auto pair = std::make_unique<bridge_pair>();
                 llama_model_params mp = llama_model_default_params();
                 mp.vocab_only = true;
                 pair->target = llama_model_load_from_file(target_path.c_str(), mp);
                 pair->draft = llama_model_load_from_file(draft_path.c_str(), mp);
                 if (pair->target == nullptr || pair->draft == nullptr) {
                     throw py::value_error("could not load a vocabulary from " + (pair->target ? draft_path : target_path));
                 }
                 pair->bridge = std::make_unique<cospec::text_bridge>(llama_model_get_vocab(pair->target),
                                                                      llama_model_get_vocab(pair->draft));
                 return pair;
             }), py::arg("target_path"), py::arg("draft_path"))
        .def("begin", [](bridge_pair & b, const std::vector<llama_token> & draft_prompt) { b.bridge->begin(draft_prompt); },
             py::arg("draft_prompt"))
        .def("append_target", [](bridge_pair & b, llama_token t) { b.bridge->append_target(t); }, py::arg("token"))
        .def("draft_tokens", [](bridge_pair & b) { return b.bridge->draft_tokens(); })
        .def("to_target", [](bridge_pair & b, const std::vector<llama_token> & proposal) {
                 std::vector<llama_token> out;
                 b.bridge->to_target(proposal.data(), (int32_t) proposal.size(), out);
                 return out;
             }, py::arg("proposal"))
        .def_property_readonly("reply", [](bridge_pair & b) { return py::bytes(b.bridge->reply()); })
        .def("encode", [](bridge_pair & b, const py::bytes & text, bool target) {
                 return cospec::encode(llama_model_get_vocab(target ? b.target : b.draft), std::string(text));
             }, py::arg("text"), py::arg("target"))
        .def("text", [](bridge_pair & b, const std::vector<llama_token> & tokens, bool target) {
                 std::string s;
                 for (const llama_token t : tokens) s += cospec::token_bytes(llama_model_get_vocab(target ? b.target : b.draft), t);
                 return py::bytes(s);
             }, py::arg("tokens"), py::arg("target"))
        .def("round_trip", [](bridge_pair & b) {
                 std::string why_td, why_dt;
                 const bool td = cospec::texts_round_trip(llama_model_get_vocab(b.target), llama_model_get_vocab(b.draft), why_td);
                 const bool dt = cospec::texts_round_trip(llama_model_get_vocab(b.draft), llama_model_get_vocab(b.target), why_dt);
                 return py::make_tuple(td && dt, td ? why_dt : why_td);
             });
    // AMX's trial in a child process (weight_repacking.cpp), with or without the kernel's permission.
    m.def("amx_trial", &cospec::amx_trial, py::arg("ask_permission") = true);
    m.def("utf8_complete_end", [](const py::bytes & b) {
        const std::string s(b);
        return cospec::utf8_complete_end(s, s.size());
    }, py::arg("text"));

    // The adaptive length's model on its own, fed with chosen timings: what it decides from a
    // given history of costs can be checked without depending on this machine's clock.
    py::class_<cospec::draft_tuner>(m, "DraftTuner")
        .def(py::init<>())
        .def("choose", &cospec::draft_tuner::choose, py::arg("k_max"), py::arg("n_unread") = 0)
        .def("observe_catch_up", &cospec::draft_tuner::observe_catch_up, py::arg("ms"), py::arg("n_tokens"))
        .def("observe_block", &cospec::draft_tuner::observe_block, py::arg("kd"), py::arg("accepted"), py::arg("ended_early"))
        .def("observe_draft", &cospec::draft_tuner::observe_draft, py::arg("first_ms"), py::arg("step_ms"), py::arg("n_steps"))
        .def("observe_verify", &cospec::draft_tuner::observe_verify, py::arg("n_tokens"), py::arg("ms"), py::arg("fair"))
        .def("choose_for_proposal", [](cospec::draft_tuner & t, const std::vector<double> & acceptance, int32_t k_in_use,
                                       double rate_to_beat) {
                 return t.choose_for_proposal(acceptance.data(), (int32_t) acceptance.size(), k_in_use, rate_to_beat);
             }, py::arg("acceptance"), py::arg("k_in_use"), py::arg("rate_to_beat") = 0.0)
        .def("expected_rate", &cospec::draft_tuner::expected_rate, py::arg("k_max"), py::arg("n_unread") = 0)
        .def("observe_held", &cospec::draft_tuner::observe_held)
        .def_property_readonly("acceptance", &cospec::draft_tuner::acceptance);
    m.attr("DraftTuner").attr("HELD_EXPLORE_MIN") = py::int_(cospec::draft_tuner::HELD_EXPLORE_MIN);
    m.attr("DraftTuner").attr("HELD_EXPLORE_MAX") = py::int_(cospec::draft_tuner::HELD_EXPLORE_MAX);
    m.attr("DraftTuner").attr("EXPLORE_BUDGET") = py::float_(cospec::draft_tuner::EXPLORE_BUDGET);
    // Its rate model alone: the lengths it picks for given costs (verify_cost(n): verifying n tokens).
    m.def("fastest_length", [](int32_t k_max, double acceptance, double first_draft, double draft_step,
                               const py::function & verify_cost, double switch_cost, int32_t k_in_use, bool plain_in_use,
                               double plain_margin) {
        if (k_max < 0 || k_max > COSPEC_N_DRAFT_MAX) {
            throw py::value_error("k_max must be in [0, " + std::to_string(COSPEC_N_DRAFT_MAX) + "]");
        }
        double verify[cospec::MAX_BLOCK_BATCH + 1] = {};
        for (int32_t n = 1; n <= k_max + 1; ++n) {
            verify[n] = verify_cost(n).cast<double>();
        }
        const cospec::rate_inputs in {acceptance, first_draft, draft_step, verify, switch_cost, k_in_use, plain_in_use, plain_margin};
        const cospec::length_choice choice = cospec::fastest_length(in, k_max);
        return py::make_tuple(choice.best, choice.best_drafting);
    }, py::arg("k_max"), py::arg("acceptance"), py::arg("first_draft"), py::arg("draft_step"), py::arg("verify_cost"),
       py::arg("switch_cost") = 0.0, py::arg("k_in_use") = 0, py::arg("plain_in_use") = false, py::arg("plain_margin") = 1.0,
       "(best, best_drafting): the length of the most tokens per unit time in [0, k_max], and the best above 0.");

}
