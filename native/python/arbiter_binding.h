// Arbiters in Python: the built-in rules, callbacks into Python, learned arbiters loaded beside
// an engine, and the blocks they decide on as dicts of arrays.
#pragma once

#include "native_call.h"

#include <memory>
#include <vector>

namespace cospec_python {

class Engine;

using i32_array = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;
using f32_array = py::array_t<float, py::array::c_style | py::array::forcecast>;

// A block built from Python arrays (tests, tools, training data): the arrays
// stay alive as long as this object.
struct python_block {
    i32_array draft, target, context, draft_own, draft_alt;
    f32_array target_logits, draft_logits;
    std::vector<uint8_t> mismatch;
    cospec_block b {};

    explicit python_block(const py::dict & d);
};

// What a Python arbiter can provide: decide(block) -> P(keep) per position
// (booleans are fine), and optionally begin(prompt) and taken(block, decisions).
struct arbiter_state {
    callback_state decide;
    py::object begin;
    py::object taken;
    py::object reset;
};

// The rules' settings from their Python arguments, the other fields at their defaults.
cospec_fly_params fly_params(int32_t window, float entropy_threshold, int32_t entropy_top_k);
cospec_aasd_params aasd_params(float alpha, float beta);

// Decisions as a list of (block, position, token_index, p_keep, keep) tuples.
py::list decisions_to_list(const cospec_decision * d, int32_t n);

class Arbiter {
  public:
    static std::shared_ptr<Arbiter> target() { return wrap(cospec_arbiter_init_target()); }
    static std::shared_ptr<Arbiter> fly(int32_t window, float entropy_threshold, int32_t entropy_top_k);
    static std::shared_ptr<Arbiter> aasd(float alpha, float beta);
    static std::shared_ptr<Arbiter> callback(const std::string & name, py::object fn, py::object begin, py::object taken,
                                             py::object reset, bool needs_draft_logits);
    static std::shared_ptr<Arbiter> load(Engine & engine, py::object engine_ref, const std::string & path, float threshold,
                                         py::object head, int32_t n_threads, py::object fold_adapter, py::object use_gate);

    ~Arbiter() { close(); }

    void close();

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
    py::array_t<float> score(const py::dict & block);

    // A learned arbiter's head inputs for every position of a block.
    py::array_t<float> head_inputs(const py::dict & block);

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
    static std::shared_ptr<Arbiter> wrap(cospec_arbiter * a);
    std::unique_ptr<arbiter_state> state;
    std::unique_ptr<callback_state> head_state;
    py::object engine_ref = py::none(); // a learned arbiter keeps its engine's Python object alive
};

// The Arbiter class and the block functions (block_features) on the module.
void bind_arbiter(py::module_ & m);

} // namespace cospec_python
