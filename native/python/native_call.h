// What every file of the _cospec module shares: the one thread that runs llama.cpp's work, the
// native errors raised as _cospec.CospecError, text from model files, and the state of a Python
// callable called from native code.
#pragma once

#include "cospec.h"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h> // one set of type casters in every file of the module

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace py = pybind11;

namespace cospec_python {

// Every llama.cpp computation of this process runs on one long-lived thread.
// ggml's CPU backend parallelises with OpenMP, whose thread teams belong to
// the OS thread that starts them: once a second long-lived thread has run a
// parallel region (the main thread, a pool's thread), regions started from
// the others ran 10-20x slower (the demo draft: 0.08 -> 1.9 ms a token after
// one Engine.score on the main thread). Callers wait here with the GIL
// released; callbacks into Python take it back on this thread.
class compute_thread {
  public:
    static compute_thread & get();

    void run(const std::function<void()> & work);

    bool on_this_thread() const { return std::this_thread::get_id() == worker_id; }

  private:
    compute_thread();
    void loop();

    std::mutex mutex;
    std::condition_variable ready;
    std::deque<std::packaged_task<void()> *> queue;
    std::thread worker;
    std::thread::id worker_id;
};

// Run native work on the compute thread with the GIL released; returns the
// status and the message cospec_last_error() left there (it is per thread).
int32_t compute(const std::function<int32_t()> & work, std::string & message);

// Text that comes from a model file: decoded leniently (invalid UTF-8 becomes U+FFFD), since
// pybind11's strict conversion would raise UnicodeDecodeError on an untrusted file's bytes.
py::str file_text(const char * s, size_t n);

// A C string from the engine as Python text, or None for a null pointer.
py::object opt_str(const char * s);

// Raised as _cospec.CospecError(status, status_name, message).
struct native_error {
    int32_t status;
    std::string message;
};

// The status and the message cospec_last_error() holds, raised.
[[noreturn]] void raise_status(int32_t status);

// What a cospec_*_check call answers in Python: None where status is COSPEC_OK, else
// (status, field, message) with the message cospec_last_error() holds. Run the check into a
// variable first: as refusal(check(&field), field), field could be read before the check sets it.
py::object refusal(int32_t status, const char * field);

// A Python callable called from native code (arbiter, load progress, token
// stream). An exception it raises is kept here and re-raised once native code
// has returned.
struct callback_state {
    py::object fn;
    std::optional<py::error_already_set> error;
};

} // namespace cospec_python
