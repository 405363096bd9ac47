// The engine in Python: a cospec_engine opened, its vocabulary, teacher-forced scores, and
// generations run on the compute thread with their callbacks into Python.
#pragma once

#include "native_call.h"

#include <memory>
#include <vector>

namespace cospec_python {

class Arbiter;

class Engine {
  public:
    // llama.cpp's loading and cache settings, by cospec_engine_params' names ("" = the default).
    struct text_settings {
        std::string cache_type_k, cache_type_v, cache_type_k_draft, cache_type_v_draft, load_mode, devices, devices_draft,
            head_path;
    };

    Engine(const std::string & target_path, std::optional<std::string> draft_path, int32_t n_ctx, int32_t n_batch,
           int32_t n_threads, int32_t n_threads_batch, int32_t n_gpu_layers, int32_t n_gpu_layers_draft, py::object progress,
           const std::string & rpc_servers, std::optional<int32_t> flash_attn, int32_t n_ubatch, const text_settings & text,
           std::optional<bool> repack);

    ~Engine() { close(true); }

    // Learned arbiters share the draft model, so they go first. A running
    // generation is asked to stop, and the engine is freed on the compute
    // thread after it: never under a running generation.
    void close(bool from_destructor = false);

    std::vector<std::weak_ptr<Arbiter>> arbiters;

    cospec_engine * get() const {
        if (handle == nullptr) {
            throw native_error {COSPEC_ERR_INVALID_ARGUMENT, "the engine is closed"};
        }
        return handle;
    }

    // Teacher-forced logits of every position, shape (n_tokens, n_vocab of that model).
    py::array_t<float> score(int32_t which, const std::vector<int32_t> & tokens);

    std::vector<int32_t> tokenize(const std::string & text, bool add_special, bool parse_special, int32_t which) const;
    py::bytes detokenize(const std::vector<int32_t> & tokens, bool render_special) const;
    py::bytes token_to_piece(int32_t token) const;

    // cospec_generate_check: None, or (status, field, message) of the first refusal.
    py::object check(const std::vector<int32_t> & prompt, const cospec_generate_params & base, std::shared_ptr<Arbiter> arbiter,
                     const std::vector<int32_t> & draft_prompt) const;

    py::dict generate(const std::vector<int32_t> & prompt, const cospec_generate_params & base, std::shared_ptr<Arbiter> arbiter,
                      const std::vector<std::string> & stop, py::object on_token, const std::vector<int32_t> & draft_prompt,
                      const std::string & grammar, const std::string & grammar_root);

    cospec_engine * handle = nullptr;
};

// The Engine class on the module.
void bind_engine(py::module_ & m);

} // namespace cospec_python
