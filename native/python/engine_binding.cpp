#include "engine_binding.h"

#include "arbiter_binding.h"

#include <algorithm>
#include <climits>
#include <cstring>

namespace cospec_python {

namespace {

py::dict stats_to_dict(const cospec_stats & s) {
    py::dict d;
    d["n_prompt"] = s.n_prompt;
    d["n_prompt_cached"] = s.n_prompt_cached;
    d["t_prompt_ms"] = s.t_prompt_ms;
    d["n_generated"] = s.n_generated;
    d["t_generate_ms"] = s.t_generate_ms;
    d["n_blocks"] = s.n_blocks;
    d["n_drafted"] = s.n_drafted;
    d["n_accepted"] = s.n_accepted;
    d["n_kept"] = s.n_kept;
    d["n_fallback"] = s.n_fallback;
    d["n_bonus"] = s.n_bonus;
    d["n_plain"] = s.n_plain;
    d["n_arbiter_calls"] = s.n_arbiter_calls;
    d["t_arbiter_ms"] = s.t_arbiter_ms;
    d["t_draft_ms"] = s.t_draft_ms;
    d["t_verify_ms"] = s.t_verify_ms;
    d["t_sample_ms"] = s.t_sample_ms;
    d["arbiter_abstained"] = s.arbiter_abstained;
    d["n_target_decoded"] = s.n_target_decoded;
    d["n_draft_decoded"] = s.n_draft_decoded;
    d["n_restored"] = s.n_restored;
    d["n_blocks_ngram"] = s.n_blocks_ngram;
    d["n_drafted_ngram"] = s.n_drafted_ngram;
    d["n_accepted_ngram"] = s.n_accepted_ngram;
    d["n_blocks_head"] = s.n_blocks_head;
    d["n_drafted_head"] = s.n_drafted_head;
    d["n_accepted_head"] = s.n_accepted_head;
    return d;
}

bool python_progress(int32_t which, float progress, void * user_data) {
    auto * state = static_cast<callback_state *>(user_data);
    py::gil_scoped_acquire gil;
    try {
        py::object go_on = state->fn(which, progress);
        return go_on.is_none() || go_on.cast<bool>();
    } catch (py::error_already_set & e) {
        state->error = std::move(e);
        return false;
    }
}

// A token's log-probabilities as a list of (token, logprob) pairs: its own, then the likeliest.
py::list logprobs_to_list(const cospec_token_logprob * lp, int32_t n) {
    py::list out;
    for (int32_t i = 0; i < n; ++i) {
        out.append(py::make_tuple(lp[i].token, lp[i].logprob));
    }
    return out;
}

bool python_token(const cospec_token_event * ev, void * user_data) {
    auto * state = static_cast<callback_state *>(user_data);
    py::gil_scoped_acquire gil;
    try {
        py::object logprobs = ev->logprobs == nullptr ? py::object(py::none()) : py::object(logprobs_to_list(ev->logprobs, 1 + ev->n_top));
        py::object go_on = state->fn(ev->token, ev->provenance, py::bytes(ev->text, (size_t) ev->text_len), logprobs);
        return go_on.is_none() || go_on.cast<bool>();
    } catch (py::error_already_set & e) {
        state->error = std::move(e);
        return false;
    }
}

// A calibration (cospec_calibration) as a dict of plain numbers and lists, and back; the engine
// checks the values, this checks the shape.
py::dict calibration_dict(const cospec_calibration & c) {
    py::dict d;
    d["version"] = c.version;
    d["target_step_ms"] = c.target_step_ms;
    d["verify"] = std::vector<double>(c.verify + 1, c.verify + COSPEC_N_DRAFT_MAX + 2);
    d["draft_first"] = c.draft_first;
    d["draft_step"] = c.draft_step;
    d["catch_up"] = c.catch_up;
    d["draft_acceptance"] = c.draft_acceptance;
    d["draft_acceptance_sampled"] = c.draft_acceptance_sampled;
    d["ngram_acceptance"] = std::vector<double>(c.ngram_acceptance, c.ngram_acceptance + COSPEC_N_NGRAM_BUCKETS);
    return d;
}

cospec_calibration calibration_from(const py::dict & d) {
    const auto number = [&](const char * key) {
        if (!d.contains(key)) {
            throw py::value_error(std::string("calibration: no '") + key + "'");
        }
        return py::cast<double>(d[key]);
    };
    const auto numbers = [&](const char * key, size_t n, double * out) {
        if (!d.contains(key)) {
            throw py::value_error(std::string("calibration: no '") + key + "'");
        }
        const auto v = py::cast<std::vector<double>>(d[key]);
        if (v.size() != n) {
            throw py::value_error(std::string("calibration: '") + key + "' must hold " + std::to_string(n) + " numbers");
        }
        std::copy(v.begin(), v.end(), out);
    };
    cospec_calibration c {};
    c.version = (int32_t) number("version");
    c.target_step_ms = number("target_step_ms");
    numbers("verify", COSPEC_N_DRAFT_MAX + 1, c.verify + 1);
    c.draft_first = number("draft_first");
    c.draft_step = number("draft_step");
    c.catch_up = number("catch_up");
    c.draft_acceptance = number("draft_acceptance");
    c.draft_acceptance_sampled = number("draft_acceptance_sampled");
    numbers("ngram_acceptance", COSPEC_N_NGRAM_BUCKETS, c.ngram_acceptance);
    return c;
}

// The settings with a request's arbiter and draft prompt: what check and generate both run on.
cospec_generate_params with_request(const cospec_generate_params & base, const std::shared_ptr<Arbiter> & arbiter,
                                    const std::vector<int32_t> & draft_prompt) {
    cospec_generate_params p = base;
    p.arbiter = arbiter ? arbiter->get() : nullptr;
    p.draft_prompt = draft_prompt.empty() ? nullptr : draft_prompt.data();
    p.n_draft_prompt = (int32_t) draft_prompt.size();
    return p;
}

} // namespace

Engine::Engine(const std::string & target_path, std::optional<std::string> draft_path, int32_t n_ctx, int32_t n_batch,
       int32_t n_threads, int32_t n_threads_batch, int32_t n_gpu_layers, int32_t n_gpu_layers_draft, py::object progress,
       const std::string & rpc_servers, std::optional<int32_t> flash_attn, int32_t n_ubatch, const text_settings & text,
       std::optional<bool> repack) {
    cospec_engine_params p = cospec_engine_default_params();
    p.n_ubatch = n_ubatch;
    if (repack) {
        p.use_extra_buffers = *repack;
    }
    p.cache_type_k = text.cache_type_k.c_str();
    p.cache_type_v = text.cache_type_v.c_str();
    p.cache_type_k_draft = text.cache_type_k_draft.c_str();
    p.cache_type_v_draft = text.cache_type_v_draft.c_str();
    p.load_mode = text.load_mode.c_str();
    p.devices = text.devices.c_str();
    p.devices_draft = text.devices_draft.c_str();
    p.head_path = text.head_path.c_str();
    if (flash_attn) {
        p.flash_attn = *flash_attn;
    }
    p.rpc_servers = rpc_servers.c_str();
    p.target_path = target_path.c_str();
    p.draft_path = draft_path ? draft_path->c_str() : nullptr;
    p.n_ctx = n_ctx;
    p.n_batch = n_batch;
    p.n_threads = n_threads;
    p.n_threads_batch = n_threads_batch;
    p.n_gpu_layers_target = n_gpu_layers;
    p.n_gpu_layers_draft = n_gpu_layers_draft;
    callback_state ps {progress, std::nullopt};
    if (!progress.is_none()) {
        p.progress_callback = python_progress;
        p.progress_user_data = &ps;
    }
    std::string message;
    const int32_t status = compute([&] { return cospec_engine_open(&p, &handle); }, message);
    if (ps.error) {
        throw std::move(*ps.error);
    }
    if (status != COSPEC_OK) {
        throw native_error {status, message};
    }
}

void Engine::close(bool from_destructor) {
    if (handle != nullptr && compute_thread::get().on_this_thread()) {
        // Inside a callback of a generation: freeing here would free under it.
        if (from_destructor) {
            handle = nullptr; // collected inside a callback: leak rather than free a running engine
            return;
        }
        throw native_error {COSPEC_ERR_INVALID_ARGUMENT, "close() cannot run inside a generation's callback; "
                                                         "call abort() there and close the engine afterwards"};
    }
    if (handle != nullptr) {
        cospec_engine_abort(handle);
    }
    for (auto & weak : arbiters) {
        if (auto a = weak.lock()) {
            a->close();
        }
    }
    arbiters.clear();
    if (handle != nullptr) {
        cospec_engine * e = handle;
        handle = nullptr;
        std::string message;
        compute([&] { cospec_engine_free(e); return COSPEC_OK; }, message);
    }
}

py::array_t<float> Engine::score(int32_t which, const std::vector<int32_t> & tokens) {
    cospec_engine * e = get();
    const int32_t n_vocab = cospec_engine_n_vocab_of(e, which);
    if (n_vocab == 0) {
        throw native_error {which == 1 ? COSPEC_ERR_NO_DRAFT : COSPEC_ERR_INVALID_ARGUMENT,
                            "no such model (which = " + std::to_string(which) + ")"};
    }
    py::array_t<float> out({(py::ssize_t) tokens.size(), (py::ssize_t) n_vocab});
    float * data = out.mutable_data();
    const size_t size = tokens.size() * (size_t) n_vocab;
    std::string message;
    const int32_t status = compute([&] { return cospec_score(e, which, tokens.data(), (int32_t) tokens.size(), data, size); },
                                   message);
    if (status != COSPEC_OK) {
        throw native_error {status, message};
    }
    return out;
}

std::vector<int32_t> Engine::tokenize(const std::string & text, bool add_special, bool parse_special, int32_t which) const {
    std::vector<int32_t> tokens(text.size() + 8);
    const auto run = [&] {
        return cospec_tokenize_of(get(), which, text.data(), (int32_t) text.size(), tokens.data(), (int32_t) tokens.size(),
                                  add_special, parse_special);
    };
    int32_t n = run();
    if (n < 0 && n > INT32_MIN) { // room for -n tokens was missing (or an error: the retry fails too)
        tokens.resize((size_t) -n);
        n = run();
    }
    if (n < 0) {
        raise_status(COSPEC_ERR_INVALID_ARGUMENT);
    }
    tokens.resize((size_t) n);
    return tokens;
}

py::bytes Engine::detokenize(const std::vector<int32_t> & tokens, bool render_special) const {
    std::string out(tokens.size() * 8 + 16, '\0');
    int32_t n = cospec_detokenize(get(), tokens.data(), (int32_t) tokens.size(), out.data(), (int32_t) out.size(), render_special);
    if (n < 0 && std::string(cospec_last_error()).empty()) {
        out.assign((size_t) -n, '\0');
        n = cospec_detokenize(get(), tokens.data(), (int32_t) tokens.size(), out.data(), (int32_t) out.size(), render_special);
    }
    if (n < 0) {
        raise_status(COSPEC_ERR_INVALID_ARGUMENT);
    }
    out.resize((size_t) n);
    return py::bytes(out);
}

py::bytes Engine::token_to_piece(int32_t token) const {
    char buf[256];
    int32_t n = cospec_token_to_piece(get(), token, buf, sizeof(buf));
    if (n < 0) {
        std::string big((size_t) -n, '\0');
        n = cospec_token_to_piece(get(), token, big.data(), (int32_t) big.size());
        return py::bytes(big.data(), (size_t) std::max(n, 0));
    }
    return py::bytes(buf, (size_t) n);
}

py::object Engine::check(const std::vector<int32_t> & prompt, const cospec_generate_params & base,
                         std::shared_ptr<Arbiter> arbiter, const std::vector<int32_t> & draft_prompt) const {
    const cospec_generate_params p = with_request(base, arbiter, draft_prompt);
    const char * field = "";
    const int32_t status = cospec_generate_check(get(), prompt.data(), (int32_t) prompt.size(), &p, &field);
    return refusal(status, field);
}

py::dict Engine::generate(const std::vector<int32_t> & prompt, const cospec_generate_params & base, std::shared_ptr<Arbiter> arbiter,
                  const std::vector<std::string> & stop, py::object on_token, const std::vector<int32_t> & draft_prompt,
                  const std::string & grammar, const std::string & grammar_root) {
    cospec_generate_params p = with_request(base, arbiter, draft_prompt);
    p.grammar = grammar.empty() ? nullptr : grammar.c_str();
    p.grammar_root = grammar_root.empty() ? nullptr : grammar_root.c_str();
    std::vector<const char *> stop_ptrs;
    for (const auto & s : stop) {
        stop_ptrs.push_back(s.c_str());
    }
    p.stop = stop_ptrs.data();
    p.n_stop = (int32_t) stop_ptrs.size();
    callback_state ss {on_token, std::nullopt};
    p.token_callback = on_token.is_none() ? nullptr : python_token;
    p.token_user_data = &ss;
    cospec_engine * e = get();
    cospec_result * res = nullptr;
    std::string message;
    const int32_t status = compute([&] { return cospec_generate(e, prompt.data(), (int32_t) prompt.size(), &p, &res); },
                                   message);
    std::unique_ptr<cospec_result, decltype(&cospec_result_free)> owned(res, cospec_result_free);
    // A Python exception from a callback travels in the result, so the
    // caller gets both the exception and the tokens produced before it.
    py::object callback_error = py::none();
    std::optional<py::error_already_set> * pending[] = {arbiter ? arbiter->pending_error() : nullptr, &ss.error};
    for (auto * err : pending) {
        if (err != nullptr && err->has_value() && callback_error.is_none()) {
            callback_error = (*err)->value();
            err->reset();
        }
    }
    if (res == nullptr) {
        throw native_error {status, message};
    }
    py::dict out;
    int32_t len = 0, n = 0, n_prov = 0, n_dec = 0;
    const char * text = cospec_result_text(res, &len);
    const cospec_token * toks = cospec_result_tokens(res, &n);
    const int32_t * prov = cospec_result_provenance(res, &n_prov);
    const cospec_decision * dec = cospec_result_decisions(res, &n_dec);
    out["text"] = py::bytes(text, (size_t) len);
    out["tokens"] = std::vector<int32_t>(toks, toks + n);
    out["provenance"] = std::vector<int32_t>(prov, prov + n_prov);
    out["decisions"] = decisions_to_list(dec, n_dec);
    int32_t per_token = 0;
    const cospec_token_logprob * lp = cospec_result_logprobs(res, &per_token);
    py::list logprobs;
    for (int32_t i = 0; lp != nullptr && i < n; ++i) {
        logprobs.append(logprobs_to_list(lp + (size_t) i * per_token, per_token));
    }
    out["logprobs"] = lp == nullptr ? py::object(py::none()) : py::object(logprobs);
    out["stop_reason"] = cospec_result_stop_reason(res);
    out["status"] = status;
    out["status_name"] = cospec_status_name(status);
    out["error"] = std::string(cospec_result_error(res));
    out["stats"] = stats_to_dict(cospec_result_stats(res));
    out["callback_error"] = callback_error;
    return out;
}

void bind_engine(py::module_ & m) {
    py::class_<Engine>(m, "Engine")
        .def(py::init([](const std::string & target_path, std::optional<std::string> draft_path, int32_t n_ctx, int32_t n_batch,
                         int32_t n_threads, int32_t n_threads_batch, int32_t n_gpu_layers, int32_t n_gpu_layers_draft,
                         py::object progress, const std::string & rpc_servers, std::optional<int32_t> flash_attn,
                         int32_t n_ubatch, std::string cache_type_k, std::string cache_type_v, std::string cache_type_k_draft,
                         std::string cache_type_v_draft, std::string load_mode, std::string devices, std::string devices_draft,
                         std::string head_path, std::optional<bool> repack) {
                 return std::make_unique<Engine>(target_path, draft_path, n_ctx, n_batch, n_threads, n_threads_batch,
                                                 n_gpu_layers, n_gpu_layers_draft, progress, rpc_servers, flash_attn, n_ubatch,
                                                 Engine::text_settings {cache_type_k, cache_type_v, cache_type_k_draft,
                                                                        cache_type_v_draft, load_mode, devices, devices_draft,
                                                                        head_path},
                                                 repack);
             }),
             py::arg("target_path"), py::arg("draft_path") = py::none(), py::arg("n_ctx") = 4096, py::arg("n_batch") = 512,
             py::arg("n_threads") = 0, py::arg("n_threads_batch") = 0, py::arg("n_gpu_layers") = -1,
             py::arg("n_gpu_layers_draft") = -1, py::arg("progress") = py::none(), py::arg("rpc_servers") = "",
             py::arg("flash_attn") = py::none(), py::arg("n_ubatch") = 0, py::arg("cache_type_k") = "",
             py::arg("cache_type_v") = "", py::arg("cache_type_k_draft") = "", py::arg("cache_type_v_draft") = "",
             py::arg("load_mode") = "", py::arg("devices") = "", py::arg("devices_draft") = "", py::arg("head_path") = "",
             py::arg("repack") = py::none())
        .def("close", [](Engine & e) { e.close(); })
        .def("abort", [](Engine & e) { cospec_engine_abort(e.handle); })
        .def("reset", [](Engine & e) {
            cospec_engine * h = e.get();
            if (compute_thread::get().on_this_thread()) {
                throw native_error {COSPEC_ERR_INVALID_ARGUMENT, "reset() cannot run inside a generation's callback"};
            }
            cospec_engine_abort(h); // a running generation stops; the reset runs after it
            std::string message;
            compute([&] { cospec_engine_reset(h); return COSPEC_OK; }, message);
        })
        .def_property_readonly("closed", [](const Engine & e) { return e.handle == nullptr; })
        .def_property_readonly("has_draft", [](const Engine & e) { return cospec_engine_has_draft(e.get()); })
        .def("repacked_bytes", [](const Engine & e, int32_t which) { return cospec_engine_repacked_bytes(e.get(), which); },
             py::arg("which"))
        .def_property_readonly("head", [](const Engine & e) -> py::object {
            const char * kind = cospec_engine_head(e.get());
            return kind != nullptr ? py::object(py::str(kind)) : py::object(py::none());
        })
        .def_property_readonly("n_ctx", [](const Engine & e) { return cospec_engine_n_ctx(e.get()); })
        .def_property_readonly("n_vocab", [](const Engine & e) { return cospec_engine_n_vocab(e.get()); })
        .def_property_readonly("fim_tokens", [](const Engine & e) -> py::object {
            cospec_token pre = -1, suf = -1, mid = -1;
            if (cospec_engine_fim_tokens(e.get(), &pre, &suf, &mid) != COSPEC_OK) {
                return py::none(); // (the message stays for the next error to replace)
            }
            return py::make_tuple(pre, suf, mid);
        })
        .def_property_readonly("bos", [](const Engine & e) { return cospec_token_bos(e.get()); })
        .def_property_readonly("eos", [](const Engine & e) { return cospec_token_eos(e.get()); })
        .def("bos_of", [](const Engine & e, int32_t which) { return cospec_token_bos_of(e.get(), which); }, py::arg("which"))
        .def("eos_of", [](const Engine & e, int32_t which) { return cospec_token_eos_of(e.get(), which); }, py::arg("which"))
        .def("chat_template", [](const Engine & e, int32_t which) { return opt_str(cospec_engine_chat_template(e.get(), which)); },
             py::arg("which") = 0)
        .def("model_desc", [](const Engine & e, int32_t which) { return opt_str(cospec_engine_model_desc(e.get(), which)); },
             py::arg("which") = 0)
        .def("flash_attn", [](const Engine & e, int32_t which) { return cospec_engine_flash_attn(e.get(), which); },
             py::arg("which") = 0)
        .def("meta", [](const Engine & e, int32_t which, const std::string & key) -> py::object {
            std::string buf(256, '\0');
            int32_t n = cospec_engine_meta(e.get(), which, key.c_str(), buf.data(), buf.size());
            if (n < 0) {
                return py::none();
            }
            if ((size_t) n >= buf.size()) {
                buf.assign((size_t) n + 1, '\0');
                n = cospec_engine_meta(e.get(), which, key.c_str(), buf.data(), buf.size());
            }
            return file_text(buf.data(), (size_t) std::max(n, 0));
        }, py::arg("which"), py::arg("key"))
        .def("score", &Engine::score, py::arg("which"), py::arg("tokens"))
        .def("prompt_embedding", [](Engine & self, const std::vector<int32_t> & tokens) {
            cospec_engine * e = self.get();
            std::vector<float> v(1 << 16);
            std::string message;
            const int32_t n = compute([&] { return cospec_prompt_embedding(e, tokens.data(), (int32_t) tokens.size(),
                                                                           v.data(), v.size()); }, message);
            if (n < 0) {
                throw native_error {n, message};
            }
            py::array_t<float> out(n);
            std::copy(v.begin(), v.begin() + n, out.mutable_data());
            return out;
        }, py::arg("tokens"), "The draft's pooled, normalised hidden state of a prompt (what an embedding gate reads).")
        .def("tokenize", &Engine::tokenize, py::arg("text"), py::arg("add_special") = true, py::arg("parse_special") = true,
             py::arg("which") = 0)
        .def("token_to_piece", &Engine::token_to_piece, py::arg("token"))
        .def("detokenize", &Engine::detokenize, py::arg("tokens"), py::arg("render_special") = false)
        .def("token_text", [](const Engine & e, int32_t t, int32_t which) {
            const char * s = cospec_token_text_of(e.get(), which, t);
            return file_text(s, std::strlen(s));
        }, py::arg("token"), py::arg("which") = 0)
        .def("is_eog", [](const Engine & e, int32_t t) { return cospec_token_is_eog(e.get(), t); })
        .def("check", &Engine::check, py::arg("prompt"), py::arg("params"), py::arg("arbiter") = nullptr,
             py::arg("draft_prompt") = std::vector<int32_t>(),
             "cospec_generate_check: None, or (status, field, message) of the first setting it refuses.")
        .def("generate", &Engine::generate, py::arg("prompt"), py::arg("params"), py::arg("arbiter") = nullptr,
             py::arg("stop") = std::vector<std::string>(), py::arg("on_token") = py::none(),
             py::arg("draft_prompt") = std::vector<int32_t>(), py::arg("grammar") = std::string(),
             py::arg("grammar_root") = std::string())
        .def("grammar_check", [](const Engine & e, int32_t which, const std::string & grammar, const std::string & root) {
            if (cospec_grammar_check(e.get(), which, grammar.c_str(), root.empty() ? nullptr : root.c_str()) != COSPEC_OK) {
                raise_status(COSPEC_ERR_INVALID_ARGUMENT);
            }
        }, py::arg("which"), py::arg("grammar"), py::arg("root") = std::string())
        .def("measure_costs", [](Engine & e, const std::vector<int32_t> & context) {
            cospec_engine * h = e.get();
            cospec_calibration c {};
            std::string message;
            const int32_t status = compute([&] {
                return cospec_engine_measure_costs(h, context.data(), (int32_t) context.size(), &c);
            }, message);
            if (status != COSPEC_OK) {
                throw native_error {status, message};
            }
            return calibration_dict(c);
        }, py::arg("context"))
        .def("set_calibration", [](Engine & e, const py::object & calibration) {
            cospec_engine * h = e.get();
            std::optional<cospec_calibration> c;
            if (!calibration.is_none()) {
                c = calibration_from(calibration.cast<py::dict>());
            }
            std::string message;
            const int32_t status = compute([&] { return cospec_engine_set_calibration(h, c ? &*c : nullptr); }, message);
            if (status != COSPEC_OK) {
                throw native_error {status, message};
            }
        }, py::arg("calibration"))
        .def("get_calibration", [](const Engine & e) -> py::object {
            cospec_calibration c {};
            if (!cospec_engine_get_calibration(e.get(), &c)) {
                return py::none();
            }
            return calibration_dict(c);
        })
        .def("vocab_difference", [](const Engine & e) -> py::object {
            const char * d = cospec_engine_vocab_difference(e.get());
            return d == nullptr ? py::none() : py::object(py::str(d));
        });
}

} // namespace cospec_python
