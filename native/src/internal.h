// Shared helpers of the native library (not part of the public API).
#pragma once

#include "cospec.h"

#include <string>

namespace cospec {

// Record a failure message for cospec_last_error() and return the status.
int32_t fail(int32_t status, const std::string & message);
void    clear_error();

} // namespace cospec

struct cospec_arbiter {
    virtual ~cospec_arbiter() = default;
    virtual const char * name() const = 0;
    // True for the target arbiter: the engine may then skip calling it and
    // stop judging a block at its first mismatch.
    virtual bool always_rejects() const { return false; }
    // Fill keep[i] for every mismatch position; return 0 on success.
    virtual int32_t decide(const cospec_block & block, uint8_t * keep) = 0;
};
