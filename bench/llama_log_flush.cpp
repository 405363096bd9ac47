// Linked into the llama.cpp tools the benchmarks build. llama.cpp's common logger writes from a
// worker thread and is deliberately never destroyed (llama.cpp #22142), so the lines still queued
// when main returns are lost: about one run in a hundred ended with exit code 0 and no
// "decoded ... tokens" line. Draining the logger at exit keeps every line.
#include "log.h"

#include <cstdlib>

static const int drain_log_at_exit = std::atexit([] { common_log_pause(common_log_main()); });
