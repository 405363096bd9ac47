// Python bindings of the C API (module cospec_local._cospec).
// Native work runs with the GIL released; callbacks into Python take it back.
#include "cospec.h"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

// Every llama.cpp computation of this process runs on one long-lived thread.
// ggml's CPU backend parallelises with OpenMP, whose thread teams belong to
// the OS thread that starts them: once a second long-lived thread has run a
// parallel region (the main thread, a pool's thread), regions started from
// the others ran 10-20x slower (the demo draft: 0.08 -> 1.9 ms a token after
// one Engine.score on the main thread). Callers wait here with the GIL
// released; callbacks into Python take it back on this thread.
class compute_thread {
  public:
    static compute_thread & get() {
        static compute_thread * instance = new compute_thread(); // never destroyed: it may outlive interpreter exit
        return *instance;
    }

    void run(const std::function<void()> & work) {
        if (on_this_thread()) {
            work(); // a callback already on this thread (e.g. an arbiter that scores)
            return;
        }
        std::packaged_task<void()> task(work);
        std::future<void> done = task.get_future();
        {
            std::lock_guard<std::mutex> lock(mutex);
            queue.push_back(&task);
        }
        ready.notify_one();
        done.get(); // rethrows what the work threw
    }

    bool on_this_thread() const { return std::this_thread::get_id() == worker_id; }

  private:
    compute_thread() : worker([this] { loop(); }) {
        worker_id = worker.get_id(); // a detached std::thread no longer knows its id
        worker.detach();
    }

    void loop() {
        for (;;) {
            std::packaged_task<void()> * task;
            {
                std::unique_lock<std::mutex> lock(mutex);
                ready.wait(lock, [this] { return !queue.empty(); });
                task = queue.front();
                queue.pop_front();
            }
            (*task)();
        }
    }

    std::mutex mutex;
    std::condition_variable ready;
    std::deque<std::packaged_task<void()> *> queue;
    std::thread worker;
    std::thread::id worker_id;
};

// Run native work on the compute thread with the GIL released; returns the
// status and the message cospec_last_error() left there (it is per thread).
int32_t compute(const std::function<int32_t()> & work, std::string & message) {
    int32_t status = COSPEC_ERR_INTERNAL;
    py::gil_scoped_release release;
    compute_thread::get().run([&] {
        status = work();
        message = status < 0 ? cospec_last_error() : "";
    });
    return status;
}

// Text that comes from a model file: decoded leniently (invalid UTF-8 becomes U+FFFD), since
// pybind11's strict conversion would raise UnicodeDecodeError on an untrusted file's bytes.
py::str file_text(const char * s, size_t n) {
    PyObject * o = PyUnicode_DecodeUTF8(s, (Py_ssize_t) n, "replace");
    if (o == nullptr) {
        throw py::error_already_set();
    }
    return py::reinterpret_steal<py::str>(o);
}

// Raised as _cospec.CospecError(status, status_name, message).
struct native_error {
    int32_t status;
    std::string message;
};

[[noreturn]] void raise_status(int32_t status) {
    throw native_error {status, cospec_last_error()};
}

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

// A Python callable called from native code (arbiter, load progress, token
// stream). An exception it raises is kept here and re-raised once native code
// has returned.
struct callback_state {
    py::object fn;
    std::optional<py::error_already_set> error;
};

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
    // A draft of another vocabulary: its own tokens at the block's positions (else None).
    d["draft_own"] = b.draft_own != nullptr ? py::object(py::array_t<int32_t>(k, b.draft_own)) : py::none();
    d["draft_alt"] = b.draft_alt != nullptr ? py::object(py::array_t<int32_t>(k, b.draft_alt)) : py::none();
    return d;
}

using i32_array = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;
using f32_array = py::array_t<float, py::array::c_style | py::array::forcecast>;

// A block built from Python arrays (tests, tools, training data): the arrays
// stay alive as long as this object.
struct python_block {
    i32_array draft, target, context, draft_own, draft_alt;
    f32_array target_logits, draft_logits;
    std::vector<uint8_t> mismatch;
    cospec_block b {};

    explicit python_block(const py::dict & d) {
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
};

// What a Python arbiter can provide: decide(block) -> P(keep) per position
// (booleans are fine), and optionally begin(prompt) and taken(block, decisions).
struct arbiter_state {
    callback_state decide;
    py::object begin;
    py::object taken;
    py::object reset;
};

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

py::list decisions_to_list(const cospec_decision * d, int32_t n) {
    py::list out;
    for (int32_t i = 0; i < n; ++i) {
        out.append(py::make_tuple(d[i].block, d[i].position, d[i].token_index, d[i].p_keep, d[i].keep));
    }
    return out;
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

class Engine;

class Arbiter {
  public:
    static std::shared_ptr<Arbiter> target() { return wrap(cospec_arbiter_init_target()); }
    static std::shared_ptr<Arbiter> fly(int32_t window, float entropy_threshold, int32_t entropy_top_k) {
        cospec_fly_params p = cospec_fly_default_params();
        p.window = window;
        p.entropy_threshold = entropy_threshold;
        p.entropy_top_k = entropy_top_k;
        return wrap(cospec_arbiter_init_fly(p));
    }
    static std::shared_ptr<Arbiter> aasd(float alpha, float beta) {
        cospec_aasd_params p = cospec_aasd_default_params();
        p.alpha = alpha;
        p.beta = beta;
        return wrap(cospec_arbiter_init_aasd(p));
    }
    static std::shared_ptr<Arbiter> callback(const std::string & name, py::object fn, py::object begin, py::object taken,
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
    static std::shared_ptr<Arbiter> load(Engine & engine, py::object engine_ref, const std::string & path, float threshold,
                                         py::object head, int32_t n_threads, py::object fold_adapter, py::object use_gate);

    ~Arbiter() { close(); }

    void close() {
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

    cospec_arbiter * get() const {
        if (handle == nullptr) {
            throw native_error {COSPEC_ERR_INVALID_ARGUMENT, "the arbiter is closed (its engine was closed)"};
        }
        return handle;
    }

    py::str name() const {
        const char * s = cospec_arbiter_name(get());
        return file_text(s, std::strlen(s));
    }

    // P(keep) at every position of a hand-built block (tests, tools, training data).
    py::array_t<float> score(const py::dict & block) {
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

    // A learned arbiter's head inputs for every position of a block.
    py::array_t<float> head_inputs(const py::dict & block) {
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

    std::optional<py::error_already_set> * pending_error() {
        if (state && state->decide.error) return &state->decide.error;
        if (head_state && head_state->error) return &head_state->error;
        return nullptr;
    }

    void rethrow_callback_error() {
        if (auto * err = pending_error()) {
            py::error_already_set e = std::move(**err);
            err->reset();
            throw e;
        }
    }

    cospec_arbiter * handle = nullptr;

  private:
    static std::shared_ptr<Arbiter> wrap(cospec_arbiter * a) {
        if (a == nullptr) {
            raise_status(COSPEC_ERR_INVALID_ARGUMENT);
        }
        auto out = std::make_shared<Arbiter>();
        out->handle = a;
        return out;
    }
    std::unique_ptr<arbiter_state> state;
    std::unique_ptr<callback_state> head_state;
    py::object engine_ref = py::none(); // a learned arbiter keeps its engine's Python object alive
};

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
    numbers("ngram_acceptance", COSPEC_N_NGRAM_BUCKETS, c.ngram_acceptance);
    return c;
}

class Engine {
  public:
    // llama.cpp's loading and cache settings, by cospec_engine_params' names ("" = the default).
    struct text_settings {
        std::string cache_type_k, cache_type_v, cache_type_k_draft, cache_type_v_draft, load_mode, devices, devices_draft;
    };

    Engine(const std::string & target_path, std::optional<std::string> draft_path, int32_t n_ctx, int32_t n_batch,
           int32_t n_threads, int32_t n_threads_batch, int32_t n_gpu_layers, int32_t n_gpu_layers_draft, py::object progress,
           const std::string & rpc_servers, std::optional<int32_t> flash_attn, int32_t n_ubatch, const text_settings & text) {
        cospec_engine_params p = cospec_engine_default_params();
        p.n_ubatch = n_ubatch;
        p.cache_type_k = text.cache_type_k.c_str();
        p.cache_type_v = text.cache_type_v.c_str();
        p.cache_type_k_draft = text.cache_type_k_draft.c_str();
        p.cache_type_v_draft = text.cache_type_v_draft.c_str();
        p.load_mode = text.load_mode.c_str();
        p.devices = text.devices.c_str();
        p.devices_draft = text.devices_draft.c_str();
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

    ~Engine() { close(true); }

    // Learned arbiters share the draft model: they go first.
    // Learned arbiters share the draft model, so they go first. A running
    // generation is asked to stop, and the engine is freed on the compute
    // thread after it: never under a running generation.
    void close(bool from_destructor = false) {
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

    std::vector<std::weak_ptr<Arbiter>> arbiters;

    cospec_engine * get() const {
        if (handle == nullptr) {
            throw native_error {COSPEC_ERR_INVALID_ARGUMENT, "the engine is closed"};
        }
        return handle;
    }

    // Teacher-forced logits of every position, shape (n_tokens, n_vocab of that model).
    py::array_t<float> score(int32_t which, const std::vector<int32_t> & tokens) {
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

    std::vector<int32_t> tokenize(const std::string & text, bool add_special, bool parse_special, int32_t which) const {
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

    py::bytes detokenize(const std::vector<int32_t> & tokens, bool render_special) const {
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

    py::bytes token_to_piece(int32_t token) const {
        char buf[256];
        int32_t n = cospec_token_to_piece(get(), token, buf, sizeof(buf));
        if (n < 0) {
            std::string big((size_t) -n, '\0');
            n = cospec_token_to_piece(get(), token, big.data(), (int32_t) big.size());
            return py::bytes(big.data(), (size_t) std::max(n, 0));
        }
        return py::bytes(buf, (size_t) n);
    }

    py::dict generate(const std::vector<int32_t> & prompt, const cospec_generate_params & base, std::shared_ptr<Arbiter> arbiter,
                      const std::vector<std::string> & stop, py::object on_token, const std::vector<int32_t> & draft_prompt,
                      const std::string & grammar, const std::string & grammar_root) {
        cospec_generate_params p = base;
        p.grammar = grammar.empty() ? nullptr : grammar.c_str();
        p.grammar_root = grammar_root.empty() ? nullptr : grammar_root.c_str();
        p.arbiter = arbiter ? arbiter->get() : nullptr;
        p.draft_prompt = draft_prompt.empty() ? nullptr : draft_prompt.data();
        p.n_draft_prompt = (int32_t) draft_prompt.size();
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

    cospec_engine * handle = nullptr;
};

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

py::object opt_str(const char * s) {
    return s ? py::object(file_text(s, std::strlen(s))) : py::object(py::none());
}

} // namespace

PYBIND11_MODULE(_cospec, m) {
    m.doc() = "Native collaborative speculative decoding engine on llama.cpp";

    // Owned by the module for the life of the process (never freed on purpose).
    static PyObject * cospec_error = PyErr_NewException("cospec_local._cospec.CospecError", PyExc_RuntimeError, nullptr);
    m.add_object("CospecError", py::handle(cospec_error).inc_ref());
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) {
                std::rethrow_exception(p);
            }
        } catch (const native_error & e) {
            py::tuple args = py::make_tuple(e.status, cospec_status_name(e.status), e.message);
            PyErr_SetObject(cospec_error, args.ptr());
        }
    });

    m.def("version", &cospec_version);
    m.def("system_info", &cospec_system_info);
    m.def("status_name", &cospec_status_name, py::arg("status"));
    m.def("set_llama_log", &cospec_set_llama_log, py::arg("enabled"));
    m.def("device_names", [] { return std::string(cospec_device_names()); },
          "The devices this llama.cpp build offloads to, as -dev names them (comma-separated; '' on a CPU build).");
    m.def("supports_gpu_offload", &cospec_supports_gpu_offload);
    m.def("supports_rpc", &cospec_supports_rpc);
    // Blocks for the life of the process (the GIL released); raises if the server cannot start.
    m.def("rpc_server_run", [](const std::string & host, int32_t port, int32_t n_threads, std::optional<std::string> cache_dir) {
        int32_t status;
        std::string message;
        {
            py::gil_scoped_release released;
            status = cospec_rpc_server_run(host.c_str(), port, n_threads, cache_dir ? cache_dir->c_str() : nullptr);
            message = cospec_last_error();
        }
        throw native_error {status, message};
    }, py::arg("host"), py::arg("port"), py::arg("n_threads") = 0, py::arg("cache_dir") = py::none());
    m.def("entropy", [](py::array_t<float, py::array::c_style | py::array::forcecast> logits, float temperature) {
        return cospec_entropy(logits.data(), (int32_t) logits.size(), temperature);
    }, py::arg("logits"), py::arg("temperature") = 1.0f);

    m.attr("MODE_SPECULATIVE") = (int) COSPEC_MODE_SPECULATIVE;
    m.attr("MODE_TARGET_ONLY") = (int) COSPEC_MODE_TARGET_ONLY;
    m.attr("MODE_DRAFT_ONLY") = (int) COSPEC_MODE_DRAFT_ONLY;
    m.attr("PROV_MATCH") = (int) COSPEC_PROV_MATCH;
    m.attr("PROV_KEPT") = (int) COSPEC_PROV_KEPT;
    m.attr("PROV_FALLBACK") = (int) COSPEC_PROV_FALLBACK;
    m.attr("PROV_BONUS") = (int) COSPEC_PROV_BONUS;
    m.attr("PROV_TARGET") = (int) COSPEC_PROV_TARGET;
    m.attr("PROV_DRAFT") = (int) COSPEC_PROV_DRAFT;
    m.attr("PROV_NGRAM") = (int) COSPEC_PROV_NGRAM;
    m.attr("PROV_HEAD") = (int) COSPEC_PROV_HEAD;
    m.attr("DRAFT_NONE") = (int) COSPEC_DRAFT_NONE;
    m.attr("DRAFT_MODEL") = (int) COSPEC_DRAFT_MODEL;
    m.attr("DRAFT_NGRAM") = (int) COSPEC_DRAFT_NGRAM;
    m.attr("DRAFT_AUTO") = (int) COSPEC_DRAFT_AUTO;
    m.attr("DRAFT_HEAD") = (int) COSPEC_DRAFT_HEAD;
    m.attr("FLASH_ATTN_AUTO") = (int) COSPEC_FLASH_ATTN_AUTO;
    m.attr("FLASH_ATTN_CPU_OFF_MAX_PARAMS") = (unsigned long long) COSPEC_FLASH_ATTN_CPU_OFF_MAX_PARAMS;
    m.attr("FLASH_ATTN_OFF") = (int) COSPEC_FLASH_ATTN_OFF;
    m.attr("FLASH_ATTN_ON") = (int) COSPEC_FLASH_ATTN_ON;
    m.attr("STOP_EOG") = (int) COSPEC_STOP_EOG;
    m.attr("STOP_MAX_TOKENS") = (int) COSPEC_STOP_MAX_TOKENS;
    m.attr("STOP_STRING") = (int) COSPEC_STOP_STRING;
    m.attr("STOP_CONTEXT_FULL") = (int) COSPEC_STOP_CONTEXT_FULL;
    m.attr("STOP_ABORTED") = (int) COSPEC_STOP_ABORTED;
    m.attr("STOP_ERROR") = (int) COSPEC_STOP_ERROR;
    m.attr("N_FEATURES") = (int) COSPEC_N_FEATURES;
    {
        const cospec_learned_arbiter_params lp = cospec_learned_arbiter_default_params();
        py::dict d;
        d["fold_adapter"] = lp.fold_adapter;
        d["use_gate"] = lp.use_gate;
        m.attr("LEARNED_ARBITER_DEFAULTS") = d;
    }
    m.attr("ARBITER_FORMAT_VERSION") = (int) COSPEC_ARBITER_FORMAT_VERSION;
    m.attr("N_DRAFT_MAX") = (int) COSPEC_N_DRAFT_MAX;
    m.attr("ARBITER_TARGET") = (int) COSPEC_ARBITER_TARGET;
    m.attr("ARBITER_FLY") = (int) COSPEC_ARBITER_FLY;
    m.attr("ARBITER_CALLBACK") = (int) COSPEC_ARBITER_CALLBACK;
    m.attr("ARBITER_FEATURES") = (int) COSPEC_ARBITER_FEATURES;
    m.attr("ARBITER_LORA") = (int) COSPEC_ARBITER_LORA;
    m.attr("ARBITER_AASD") = (int) COSPEC_ARBITER_AASD;
    m.def("arbiter_kind_name", [](int32_t kind) { return opt_str(cospec_arbiter_kind_name(kind)); }, py::arg("kind"),
          "The kind's name (arbiter.gguf's spelling of a learned one); None for a value that is no kind.");
    py::list feature_names;
    for (int32_t i = 0; i < COSPEC_N_FEATURES; ++i) {
        feature_names.append(cospec_feature_name(i));
    }
    m.attr("FEATURE_NAMES") = feature_names;

    // The one place the native defaults are read from (cospec_*_default_params).
    const cospec_fly_params fly = cospec_fly_default_params();
    py::dict fly_defaults;
    fly_defaults["window"] = fly.window;
    fly_defaults["entropy_threshold"] = fly.entropy_threshold;
    fly_defaults["entropy_top_k"] = fly.entropy_top_k;
    m.attr("FLY_DEFAULTS") = fly_defaults;
    const cospec_aasd_params aasd = cospec_aasd_default_params();
    py::dict aasd_defaults;
    aasd_defaults["alpha"] = aasd.alpha;
    aasd_defaults["beta"] = aasd.beta;
    m.attr("AASD_DEFAULTS") = aasd_defaults;
    m.attr("DEFAULT_VERIFY_COST") = COSPEC_DEFAULT_VERIFY_COST;
    m.attr("DEFAULT_N_CTX") = COSPEC_DEFAULT_N_CTX;
    m.attr("CALIBRATION_VERSION") = COSPEC_CALIBRATION_VERSION;
    m.attr("N_NGRAM_BUCKETS") = COSPEC_N_NGRAM_BUCKETS;
    m.attr("N_TOP_LOGPROBS_MAX") = COSPEC_N_TOP_LOGPROBS_MAX;
    m.def("json_schema_to_grammar", [](const std::string & schema, const std::string & rule_name, const std::string & root_rule) {
        const char * grammar = cospec_json_schema_to_grammar(schema.c_str(), rule_name.c_str(), root_rule.c_str());
        if (grammar == nullptr) {
            raise_status(COSPEC_ERR_INVALID_ARGUMENT);
        }
        return std::string(grammar);
    }, py::arg("schema"), py::arg("rule_name") = std::string(), py::arg("root_rule") = std::string(),
       "A JSON schema's grammar by llama.cpp's converter (cospec_json_schema_to_grammar).");

    py::class_<cospec_generate_params>(m, "GenerateParams",
                                       "cospec_generate_params: constructed with cospec_generate_default_params()")
        .def(py::init([] { return cospec_generate_default_params(); }))
        .def_readwrite("mode", &cospec_generate_params::mode)
        .def_property(
            "draft_sources",
            [](const cospec_generate_params & p) {
                return std::vector<int32_t>(p.draft_sources, p.draft_sources + COSPEC_N_DRAFT_SOURCES);
            },
            [](cospec_generate_params & p, const std::vector<int32_t> & sources) {
                if (sources.size() > COSPEC_N_DRAFT_SOURCES) {
                    throw py::value_error("at most " + std::to_string(COSPEC_N_DRAFT_SOURCES) + " draft sources");
                }
                std::fill(p.draft_sources, p.draft_sources + COSPEC_N_DRAFT_SOURCES, COSPEC_DRAFT_NONE);
                std::copy(sources.begin(), sources.end(), p.draft_sources);
            })
        .def_readwrite("n_predict", &cospec_generate_params::n_predict)
        .def_readwrite("n_draft", &cospec_generate_params::n_draft)
        .def_readwrite("n_draft_min", &cospec_generate_params::n_draft_min)
        .def_readwrite("n_draft_ngram", &cospec_generate_params::n_draft_ngram)
        .def_readwrite("draft_p_min", &cospec_generate_params::draft_p_min)
        .def_readwrite("draft_cost", &cospec_generate_params::draft_cost)
        .def_readwrite("verify_cost", &cospec_generate_params::verify_cost)
        .def_readwrite("adaptive_draft", &cospec_generate_params::adaptive_draft)
        .def_readwrite("temperature", &cospec_generate_params::temperature)
        .def_readwrite("top_k", &cospec_generate_params::top_k)
        .def_readwrite("top_p", &cospec_generate_params::top_p)
        .def_readwrite("min_p", &cospec_generate_params::min_p)
        .def_readwrite("repeat_penalty", &cospec_generate_params::repeat_penalty)
        .def_readwrite("repeat_last_n", &cospec_generate_params::repeat_last_n)
        .def_readwrite("seed", &cospec_generate_params::seed)
        .def_readwrite("sample_arbiter", &cospec_generate_params::sample_arbiter)
        .def_readwrite("ignore_eos", &cospec_generate_params::ignore_eos)
        .def_readwrite("logprobs", &cospec_generate_params::logprobs)
        .def_readwrite("n_top_logprobs", &cospec_generate_params::n_top_logprobs);

    m.def("block_features", [](const py::dict & block) {
        python_block pb(block);
        py::array_t<float> out({(py::ssize_t) pb.b.n_draft, (py::ssize_t) COSPEC_N_FEATURES});
        const int32_t status = cospec_block_features(&pb.b, out.mutable_data(), (size_t) pb.b.n_draft * COSPEC_N_FEATURES);
        if (status != COSPEC_OK) {
            raise_status(status);
        }
        return out;
    }, py::arg("block"), "Per-position features of a block dict (draft, target, target_logits, draft_logits).");
    m.def("model_fingerprint", [](const std::string & path) {
        char buf[32];
        int32_t n;
        {
            py::gil_scoped_release release;
            n = cospec_model_fingerprint(path.c_str(), buf, sizeof(buf));
        }
        if (n < 0) {
            raise_status(n);
        }
        return std::string(buf, (size_t) n);
    }, py::arg("path"), "64-bit fingerprint (hex) of a GGUF model's tensors.");

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

    py::class_<Engine>(m, "Engine")
        .def(py::init([](const std::string & target_path, std::optional<std::string> draft_path, int32_t n_ctx, int32_t n_batch,
                         int32_t n_threads, int32_t n_threads_batch, int32_t n_gpu_layers, int32_t n_gpu_layers_draft,
                         py::object progress, const std::string & rpc_servers, std::optional<int32_t> flash_attn,
                         int32_t n_ubatch, std::string cache_type_k, std::string cache_type_v, std::string cache_type_k_draft,
                         std::string cache_type_v_draft, std::string load_mode, std::string devices, std::string devices_draft) {
                 return std::make_unique<Engine>(target_path, draft_path, n_ctx, n_batch, n_threads, n_threads_batch,
                                                 n_gpu_layers, n_gpu_layers_draft, progress, rpc_servers, flash_attn, n_ubatch,
                                                 Engine::text_settings {cache_type_k, cache_type_v, cache_type_k_draft,
                                                                        cache_type_v_draft, load_mode, devices, devices_draft});
             }),
             py::arg("target_path"), py::arg("draft_path") = py::none(), py::arg("n_ctx") = 4096, py::arg("n_batch") = 512,
             py::arg("n_threads") = 0, py::arg("n_threads_batch") = 0, py::arg("n_gpu_layers") = -1,
             py::arg("n_gpu_layers_draft") = -1, py::arg("progress") = py::none(), py::arg("rpc_servers") = "",
             py::arg("flash_attn") = py::none(), py::arg("n_ubatch") = 0, py::arg("cache_type_k") = "",
             py::arg("cache_type_v") = "", py::arg("cache_type_k_draft") = "", py::arg("cache_type_v_draft") = "",
             py::arg("load_mode") = "", py::arg("devices") = "", py::arg("devices_draft") = "")
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
        .def("tokenize", &Engine::tokenize, py::arg("text"), py::arg("add_special") = true, py::arg("parse_special") = true,
             py::arg("which") = 0)
        .def("token_to_piece", &Engine::token_to_piece, py::arg("token"))
        .def("detokenize", &Engine::detokenize, py::arg("tokens"), py::arg("render_special") = false)
        .def("token_text", [](const Engine & e, int32_t t, int32_t which) {
            const char * s = cospec_token_text_of(e.get(), which, t);
            return file_text(s, std::strlen(s));
        }, py::arg("token"), py::arg("which") = 0)
        .def("is_eog", [](const Engine & e, int32_t t) { return cospec_token_is_eog(e.get(), t); })
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
