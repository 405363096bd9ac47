#include "arbiter_binding.h"

#include "engine_binding.h"

#include <algorithm>
#include <cstring>
#include <tuple>

namespace cospec_python {

namespace {

py::dict block_to_dict(const cospec_block & b) {
    py::dict d;
    const py::ssize_t k = b.n_draft;
    d["index"] = b.index;
    d["n_draft"] = b.n_draft;
    d["draft"] = py::array_t<int32_t>(k, b.draft);
    d["target"] = py::array_t<int32_t>(k + 1, b.target);
    d["mismatch"] = py::array_t<uint8_t>(k, b.mismatch).attr("astype")("bool");
    d["target_logits"] = py::array_t<float>({k + 1, (py::ssize_t) b.n_vocab_target}, b.target_logits);
    if (b.draft_logits != nullptr) {
        d["draft_logits"] = py::array_t<float>({k, (py::ssize_t) b.n_vocab_draft}, b.draft_logits);
    } else {
        d["draft_logits"] = py::none();
    }
    d["context"] = py::array_t<int32_t>(b.n_context, b.context);
    d["n_context"] = b.n_context;
    d["temperature"] = b.temperature;
    d["n_prompt"] = b.n_prompt;
    d["reply_drafted"] = b.reply_drafted;
    d["reply_agreed"] = b.reply_agreed;
    // A draft of another vocabulary: its own tokens at the block's positions (else None).
    d["draft_own"] = b.draft_own != nullptr ? py::object(py::array_t<int32_t>(k, b.draft_own)) : py::none();
    d["draft_alt"] = b.draft_alt != nullptr ? py::object(py::array_t<int32_t>(k, b.draft_alt)) : py::none();
    return d;
}

void keep_first_error(arbiter_state * s) {
    if (!s->decide.error) {
        s->decide.error = py::error_already_set();
    } else {
        PyErr_Clear();
    }
}

int32_t python_arbiter(void * user_data, const cospec_block * block, float * p_keep) {
    auto * state = static_cast<arbiter_state *>(user_data);
    py::gil_scoped_acquire gil;
    try {
        py::object out = state->decide.fn(block_to_dict(*block));
        auto scores = py::module_::import("numpy").attr("asarray")(out, "float32")
                          .cast<py::array_t<float, py::array::c_style | py::array::forcecast>>();
        if (scores.ndim() != 1 || scores.size() != block->n_draft) {
            throw py::value_error("arbiter returned " + std::to_string(scores.size()) + " scores for a block of " +
                                  std::to_string(block->n_draft));
        }
        for (int32_t i = 0; i < block->n_draft; ++i) {
            p_keep[i] = scores.data()[i];
        }
        return 0;
    } catch (py::error_already_set & e) {
        state->decide.error = std::move(e);
    } catch (py::builtin_exception & e) {
        e.set_error();
        keep_first_error(state);
    } catch (const std::exception & e) {
        PyErr_SetString(PyExc_RuntimeError, e.what());
        keep_first_error(state);
    }
    return 1;
}

void python_arbiter_begin(void * user_data, const cospec_token * prompt, int32_t n) {
    auto * state = static_cast<arbiter_state *>(user_data);
    py::gil_scoped_acquire gil;
    try {
        state->begin(py::array_t<int32_t>(n, prompt));
    } catch (py::error_already_set & e) {
        if (!state->decide.error) state->decide.error = std::move(e);
    }
}

void python_arbiter_reset(void * user_data) {
    auto * state = static_cast<arbiter_state *>(user_data);
    py::gil_scoped_acquire gil;
    try {
        state->reset();
    } catch (py::error_already_set & e) {
        if (!state->decide.error) state->decide.error = std::move(e);
    }
}

void python_arbiter_taken(void * user_data, const cospec_block * block, const cospec_decision * d, int32_t n) {
    auto * state = static_cast<arbiter_state *>(user_data);
    py::gil_scoped_acquire gil;
    try {
        state->taken(block_to_dict(*block), decisions_to_list(d, n));
    } catch (py::error_already_set & e) {
        if (!state->decide.error) state->decide.error = std::move(e);
    }
}

// A learned arbiter's head run in Python (e.g. by ONNX Runtime).
int32_t python_head(void * user_data, const float * inputs, int32_t n_rows, int32_t n_cols, float * p_keep) {
    auto * state = static_cast<callback_state *>(user_data);
    py::gil_scoped_acquire gil;
    try {
        py::array_t<float> x({(py::ssize_t) n_rows, (py::ssize_t) n_cols}, inputs);
        auto p = py::module_::import("numpy").attr("asarray")(state->fn(x), "float32")
                     .cast<py::array_t<float, py::array::c_style | py::array::forcecast>>();
        if (p.size() != n_rows) {
            throw py::value_error("arbiter head returned " + std::to_string(p.size()) + " values for " +
                                  std::to_string(n_rows) + " rows");
        }
        std::copy(p.data(), p.data() + n_rows, p_keep);
        return 0;
    } catch (py::error_already_set & e) {
        state->error = std::move(e);
    } catch (py::builtin_exception & e) {
        e.set_error();
        state->error = py::error_already_set();
    }
    return 1;
}

} // namespace

python_block::python_block(const py::dict & d) {
    draft = d["draft"].cast<i32_array>();
    target = d["target"].cast<i32_array>();
    target_logits = d["target_logits"].cast<f32_array>();
    const int32_t k = (int32_t) draft.size();
    if (target.size() != k + 1 || target_logits.ndim() != 2 || target_logits.shape(0) != k + 1) {
        throw py::value_error("block: need target of length n_draft + 1 and target_logits of shape (n_draft + 1, n_vocab)");
    }
    b.n_draft = k;
    b.n_vocab_target = (int32_t) target_logits.shape(1);
    b.draft = draft.data();
    b.target = target.data();
    b.target_logits = target_logits.data();
    if (d.contains("draft_logits") && !d["draft_logits"].is_none()) {
        draft_logits = d["draft_logits"].cast<f32_array>();
        if (draft_logits.ndim() != 2 || draft_logits.shape(0) != k) {
            throw py::value_error("block: draft_logits must have shape (n_draft, n_vocab_draft)");
        }
        b.draft_logits = draft_logits.data();
        b.n_vocab_draft = (int32_t) draft_logits.shape(1);
    } else {
        b.n_vocab_draft = b.n_vocab_target;
    }
    mismatch.resize(k);
    if (d.contains("mismatch") && !d["mismatch"].is_none()) {
        auto m = d["mismatch"].cast<py::array_t<uint8_t, py::array::c_style | py::array::forcecast>>();
        if (m.size() != k) {
            throw py::value_error("block: mismatch must have n_draft entries");
        }
        for (int32_t i = 0; i < k; ++i) mismatch[i] = m.data()[i] != 0;
    } else {
        for (int32_t i = 0; i < k; ++i) mismatch[i] = draft.data()[i] != target.data()[i];
    }
    b.mismatch = mismatch.data();
    if (d.contains("context") && !d["context"].is_none()) {
        context = d["context"].cast<i32_array>();
        b.context = context.data();
        b.n_context = (int32_t) context.size();
    } else {
        b.context = target.data();
        b.n_context = 0;
    }
    b.index = d.contains("index") ? d["index"].cast<int32_t>() : 0;
    b.temperature = d.contains("temperature") ? d["temperature"].cast<float>() : 0.0f;
    for (auto [key, field] : {std::pair {"n_prompt", &b.n_prompt}, std::pair {"reply_drafted", &b.reply_drafted},
                              std::pair {"reply_agreed", &b.reply_agreed}}) {
        *field = d.contains(key) ? d[key].cast<int32_t>() : 0;
        if (*field < 0) {
            throw py::value_error(std::string("block: ") + key + " must be >= 0");
        }
    }
    if (b.n_prompt > b.n_context || b.reply_agreed > b.reply_drafted) {
        throw py::value_error("block: need n_prompt <= the context's length and reply_agreed <= reply_drafted");
    }
    for (auto [key, array, field] : {std::tuple {"draft_own", &draft_own, &b.draft_own},
                                     std::tuple {"draft_alt", &draft_alt, &b.draft_alt}}) {
        if (d.contains(key) && !d[key].is_none()) {
            *array = d[key].cast<i32_array>();
            if (array->size() != k) {
                throw py::value_error(std::string("block: ") + key + " must have n_draft entries");
            }
            *field = array->data();
        }
    }
}

py::list decisions_to_list(const cospec_decision * d, int32_t n) {
    py::list out;
    for (int32_t i = 0; i < n; ++i) {
        out.append(py::make_tuple(d[i].block, d[i].position, d[i].token_index, d[i].p_keep, d[i].keep));
    }
    return out;
}

cospec_fly_params fly_params(int32_t window, float entropy_threshold, int32_t entropy_top_k) {
    cospec_fly_params p = cospec_fly_default_params();
    p.window = window;
    p.entropy_threshold = entropy_threshold;
    p.entropy_top_k = entropy_top_k;
    return p;
}

cospec_aasd_params aasd_params(float alpha, float beta) {
    cospec_aasd_params p = cospec_aasd_default_params();
    p.alpha = alpha;
    p.beta = beta;
    return p;
}

std::shared_ptr<Arbiter> Arbiter::fly(int32_t window, float entropy_threshold, int32_t entropy_top_k) {
    return wrap(cospec_arbiter_init_fly(fly_params(window, entropy_threshold, entropy_top_k)));
}

std::shared_ptr<Arbiter> Arbiter::aasd(float alpha, float beta) {
    return wrap(cospec_arbiter_init_aasd(aasd_params(alpha, beta)));
}

std::shared_ptr<Arbiter> Arbiter::callback(const std::string & name, py::object fn, py::object begin, py::object taken,
                                         py::object reset, bool needs_draft_logits) {
    auto state = std::make_unique<arbiter_state>();
    state->decide.fn = std::move(fn);
    state->begin = std::move(begin);
    state->taken = std::move(taken);
    state->reset = std::move(reset);
    cospec_arbiter_callbacks cb {};
    cb.decide = python_arbiter;
    cb.begin = state->begin.is_none() ? nullptr : python_arbiter_begin;
    cb.taken = state->taken.is_none() ? nullptr : python_arbiter_taken;
    cb.reset = state->reset.is_none() ? nullptr : python_arbiter_reset;
    cb.needs_draft_logits = needs_draft_logits;
    auto out = wrap(cospec_arbiter_init_callbacks(name.c_str(), &cb, state.get()));
    out->state = std::move(state);
    return out;
}

void Arbiter::close() {
    if (handle != nullptr) {
        cospec_arbiter * h = handle;
        handle = nullptr;
        std::string message;
        compute([&] { cospec_arbiter_free(h); return COSPEC_OK; }, message); // after any generation using it
    }
    if (state || head_state) {
        py::gil_scoped_acquire gil;
        state.reset();
        head_state.reset();
        engine_ref = py::none();
    }
}

py::array_t<float> Arbiter::score(const py::dict & block) {
    python_block pb(block);
    py::array_t<float> out(pb.b.n_draft);
    cospec_arbiter * a = get();
    float * data = out.mutable_data();
    std::string message;
    const int32_t status = compute([&] { return cospec_arbiter_score(a, &pb.b, data); }, message);
    rethrow_callback_error();
    if (status != COSPEC_OK) {
        throw native_error {status, message};
    }
    return out;
}

py::array_t<float> Arbiter::head_inputs(const py::dict & block) {
    python_block pb(block);
    std::vector<float> buf((size_t) std::max(pb.b.n_draft, 1) * (size_t) (1 << 16));
    cospec_arbiter * a = get();
    std::string message;
    const int32_t cols = compute([&] { return cospec_arbiter_head_inputs(a, &pb.b, buf.data(), buf.size()); }, message);
    rethrow_callback_error();
    if (cols < 0) {
        throw native_error {cols, message};
    }
    py::array_t<float> out({(py::ssize_t) pb.b.n_draft, (py::ssize_t) cols});
    std::copy(buf.begin(), buf.begin() + (size_t) pb.b.n_draft * cols, out.mutable_data());
    return out;
}

std::shared_ptr<Arbiter> Arbiter::wrap(cospec_arbiter * a) {
    if (a == nullptr) {
        raise_status(COSPEC_ERR_INVALID_ARGUMENT);
    }
    auto out = std::make_shared<Arbiter>();
    out->handle = a;
    return out;
}

std::shared_ptr<Arbiter> Arbiter::load(Engine & engine, py::object engine_ref, const std::string & path, float threshold,
                                       py::object head, int32_t n_threads, py::object fold_adapter, py::object use_gate) {
    cospec_learned_arbiter_params p = cospec_learned_arbiter_default_params();
    p.path = path.c_str();
    p.threshold = threshold;
    p.n_threads = n_threads;
    if (!fold_adapter.is_none()) {
        p.fold_adapter = fold_adapter.cast<bool>();
    }
    if (!use_gate.is_none()) {
        p.use_gate = use_gate.cast<bool>();
    }
    auto head_state = std::make_unique<callback_state>();
    if (!head.is_none()) {
        head_state->fn = head;
        p.head = python_head;
        p.head_user_data = head_state.get();
    }
    cospec_engine * e = engine.get();
    cospec_arbiter * a = nullptr;
    std::string message;
    const int32_t status = compute([&] { return cospec_arbiter_load(e, &p, &a); }, message);
    if (status != COSPEC_OK) {
        throw native_error {status, message};
    }
    auto out = wrap(a);
    out->head_state = std::move(head_state);
    out->engine_ref = std::move(engine_ref);
    engine.arbiters.push_back(out);
    return out;
}

void bind_arbiter(py::module_ & m) {
    const cospec_fly_params fly = cospec_fly_default_params();
    const cospec_aasd_params aasd = cospec_aasd_default_params();
    m.def("block_features", [](const py::dict & block) {
        python_block pb(block);
        py::array_t<float> out({(py::ssize_t) pb.b.n_draft, (py::ssize_t) COSPEC_N_FEATURES});
        const int32_t status = cospec_block_features(&pb.b, out.mutable_data(), (size_t) pb.b.n_draft * COSPEC_N_FEATURES);
        if (status != COSPEC_OK) {
            raise_status(status);
        }
        return out;
    }, py::arg("block"), "Per-position features of a block dict (draft, target, target_logits, draft_logits).");

    m.def("fly_params_check", [](int32_t window, float entropy_threshold, int32_t entropy_top_k) {
        const cospec_fly_params p = fly_params(window, entropy_threshold, entropy_top_k);
        const char * field = "";
        const int32_t status = cospec_fly_params_check(&p, &field);
        return refusal(status, field);
    }, py::arg("window"), py::arg("entropy_threshold"), py::arg("entropy_top_k"),
       "cospec_fly_params_check: None, or (status, field, message).");
    m.def("aasd_params_check", [](float alpha, float beta) {
        const cospec_aasd_params p = aasd_params(alpha, beta);
        const char * field = "";
        const int32_t status = cospec_aasd_params_check(&p, &field);
        return refusal(status, field);
    }, py::arg("alpha"), py::arg("beta"), "cospec_aasd_params_check: None, or (status, field, message).");

    py::class_<Arbiter, std::shared_ptr<Arbiter>>(m, "Arbiter")
        .def_static("target", &Arbiter::target)
        .def_static("fly", &Arbiter::fly, py::arg("window") = fly.window, py::arg("entropy_threshold") = fly.entropy_threshold,
                    py::arg("entropy_top_k") = fly.entropy_top_k)
        .def_static("aasd", &Arbiter::aasd, py::arg("alpha") = aasd.alpha, py::arg("beta") = aasd.beta)
        .def_static("callback", &Arbiter::callback, py::arg("name"), py::arg("fn"), py::arg("begin") = py::none(),
                    py::arg("taken") = py::none(), py::arg("reset") = py::none(), py::arg("needs_draft_logits") = true)
        .def_static("load", [](py::object engine, const std::string & path, float threshold, py::object head, int32_t n_threads,
                               py::object fold_adapter, py::object use_gate) {
            return Arbiter::load(engine.cast<Engine &>(), engine, path, threshold, head, n_threads, fold_adapter, use_gate);
        }, py::arg("engine"), py::arg("path"), py::arg("threshold") = -1.0f, py::arg("head") = py::none(),
           py::arg("n_threads") = 0, py::arg("fold_adapter") = py::none(), py::arg("use_gate") = py::none(),
           "fold_adapter, use_gate: None leaves the C default (cospec_learned_arbiter_default_params)")
        .def("admits", [](const Arbiter & a, const std::vector<cospec_token> & prompt) {
            return cospec_arbiter_admits(a.get(), prompt.data(), (int32_t) prompt.size());
        }, py::arg("prompt"), "Whether the arbiter decides this prompt's mismatches (False: its domain gate refuses it).")
        .def("gate_coverage", [](const Arbiter & a, const std::vector<cospec_token> & prompt) {
            const float c = cospec_arbiter_gate_coverage(a.get(), prompt.data(), (int32_t) prompt.size());
            if (c < 0.0f) {
                raise_status((int32_t) c);
            }
            return c;
        }, py::arg("prompt"), "The domain gate's score of a prompt in [0, 1], compared with its gate_threshold: a coverage gate's share of "
           "bigrams seen in training prompts, a classifier gate's probability that it is one of the tasks.")
        .def_property_readonly("name", &Arbiter::name)
        .def_property_readonly("kind", [](const Arbiter & a) { return cospec_arbiter_get_kind(a.get()); })
        .def_property_readonly("threshold", [](const Arbiter & a) { return cospec_arbiter_threshold(a.get()); })
        .def_property_readonly("can_keep", [](const Arbiter & a) { return cospec_arbiter_can_keep(a.get()); })
        .def_property_readonly("closed", [](const Arbiter & a) { return a.handle == nullptr; })
        .def("meta", [](const Arbiter & a, const std::string & key) { return opt_str(cospec_arbiter_meta(a.get(), key.c_str())); },
             py::arg("key"))
        .def("score", &Arbiter::score, py::arg("block"))
        .def("head_inputs", &Arbiter::head_inputs, py::arg("block"))
        .def("reset", [](Arbiter & a) {
            cospec_arbiter * h = a.get();
            std::string message;
            compute([&] { cospec_arbiter_reset(h); return COSPEC_OK; }, message);
        })
        .def("close", &Arbiter::close);
}

} // namespace cospec_python
