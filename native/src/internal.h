// Shared helpers of the native library (not part of the public API).
#pragma once

#include "cospec.h"

#include <cstddef>
#include <optional>
#include <string>

struct gguf_context;
struct ggml_context;

namespace cospec {

// Record a failure message for cospec_last_error() and return the status.
int32_t fail(int32_t status, const std::string & message);
void    clear_error();

// Check a GGUF file before anything parses it for real: it exists, is a
// regular file, parses as GGUF, and every tensor's data lies inside it.
// `role` names the file in messages ("target model", "arbiter head").
int32_t check_gguf_file(const char * role, const char * path);

// cospec_block_features for the rows marked in `rows` alone (nullptr: every row); the others are
// zeros. A head that reads the mismatch rows pays for no other row's two softmax passes.
int32_t block_features(const cospec_block * b, float * out, size_t out_size, const uint8_t * rows);

// Refuse metadata and tensor infos that llama.cpp would assert on (model_check.cpp).
int32_t check_model_metadata(const char * role, const char * path);
// The same checks on a GGUF already read (tensors: its tensor context, or null); who names it in errors.
int32_t check_loaded_model_metadata(const std::string & who, const gguf_context * g, const ggml_context * tensors);
// Refuse a LoRA adapter's metadata that llama.cpp would assert on (model_check.cpp).
int32_t check_adapter_metadata(const char * role, const char * path);

// The error lines llama.cpp logged since the last call, joined, and forgotten.
std::string take_llama_errors();

// The fingerprint of a model file (see cospec_model_fingerprint).
// header, where given, receives a hash of the metadata (keys, values, tensor infos), which the
// fingerprint leaves out so that a renamed model still matches its arbiters.
int32_t model_fingerprint(const char * path, std::string & out, std::string * header = nullptr);
// The same fingerprint of a GGUF already read into memory (data: its tensors, allocated);
// false where a tensor of the file's list is missing from data.
bool loaded_model_fingerprint(const gguf_context * g, const ggml_context * data, std::string & out,
                              std::string * header = nullptr);

} // namespace cospec

// Every arbiter scores a block's mismatch positions with P(keep draft token);
// the engine turns scores into decisions (threshold, or a Bernoulli draw when
// the generation samples its arbiter decisions).
struct cospec_arbiter {
    virtual ~cospec_arbiter() = default;
    virtual const char * name() const = 0;
    virtual int32_t kind() const = 0; // enum cospec_arbiter_kind
    // False for the target arbiter: the engine may then skip calling it and
    // stop judging a block at its first mismatch.
    virtual bool can_keep() const { return true; }
    // Whether the block must carry the draft's logits.
    virtual bool needs_draft_logits() const { return false; }
    virtual float threshold() const { return 0.5f; }
    // The engine an arbiter was loaded for, if it is bound to one.
    virtual const cospec_engine * engine() const { return nullptr; }
    // True where scoring decodes on the engine's own draft context (a LoRA
    // arbiter reading the draft's cache): a call from outside a generation
    // must then hold the engine, as a generation does.
    virtual bool uses_engine_draft() const { return false; }
    // False where the arbiter abstains on this prompt (a learned arbiter's domain gate): the
    // generation then decodes as with the target arbiter.
    virtual bool admits(const cospec_token * /*prompt*/, int32_t /*n_prompt*/) const { return true; }
    virtual void begin(const cospec_token * /*prompt*/, int32_t /*n_prompt*/) {}
    virtual void taken(const cospec_block & /*block*/, const cospec_decision * /*decisions*/, int32_t /*n*/) {}
    virtual void reset() {}
    // Write p_keep[i] for every mismatch position; return 0 on success.
    virtual int32_t score(const cospec_block & block, float * p_keep) = 0;
    virtual const char * meta(const char * /*key*/) const { return nullptr; }
    // A learned arbiter's verify cost of the timing-free block lengths its states were drafted under.
    virtual std::optional<double> trained_verify_cost() const { return std::nullopt; }
    // And the draft step's cost in target steps it recorded (arbiter.gguf's draft_cost).
    virtual std::optional<double> trained_draft_cost() const { return std::nullopt; }
    // The head's input rows (learned arbiters only); returns the row width or a negative status.
    virtual int32_t head_inputs(const cospec_block & /*block*/, float * /*out*/, size_t /*out_size*/) {
        return cospec::fail(COSPEC_ERR_INVALID_ARGUMENT, std::string("arbiter '") + name() + "' has no head");
    }
};
