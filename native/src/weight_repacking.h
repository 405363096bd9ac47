// llama.cpp's CPU weight repacking (its extra buffer types): which kinds this process offers, with
// AMX left out where its tile instructions do not run, and how much of a model was repacked.
#pragma once

#include "llama.h"

#include <cstdint>
#include <string>

namespace cospec {

// Once per process, before the first model loads with repacking: checks AMX (where this build of
// ggml has it) in a child process and takes it out of the CPU backend's list where it fails there.
void prepare_weight_repacking();

// The CPU backend's extra buffer types in use, comma-separated ("CPU_REPACK", "AMX,CPU_REPACK");
// "" where this CPU has no repacked kernels.
const std::string & repack_buffer_types();
// Why a kind was left out ("" where none was).
const std::string & repack_note();

// Runs AMX's first tile instructions in a child process: "" where they ran, else why AMX is left out.
// ask_permission false leaves out the kernel's permission for tile state (as a library that never
// asked for it): such a child must die with SIGILL on any x86 Linux, which tests the trial itself.
std::string amx_trial(bool ask_permission = true);

// After a model whose weights were partly repacked loads from a mapping of `path`: this process's
// mapped pages of that file are dropped (MADV_DONTNEED: clean file pages, read again from the page
// cache where touched), so that the repacked tensors' originals, never read again, stop counting
// twice in its resident memory; the weights still used from the mapping come back on first use.
void release_mapped_pages(const char * path);

// Bytes of ctx's model held in repacked buffers (private copies beside the mapped file).
int64_t repacked_model_bytes(const llama_context * ctx);

} // namespace cospec
