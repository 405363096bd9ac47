#include "native_call.h"

#include <cstring>

namespace cospec_python {

compute_thread & compute_thread::get() {
    static compute_thread * instance = new compute_thread(); // never destroyed: it may outlive interpreter exit
    return *instance;
}

void compute_thread::run(const std::function<void()> & work) {
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

compute_thread::compute_thread() : worker([this] { loop(); }) {
    worker_id = worker.get_id(); // a detached std::thread no longer knows its id
    worker.detach();
}

void compute_thread::loop() {
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

int32_t compute(const std::function<int32_t()> & work, std::string & message) {
    int32_t status = COSPEC_ERR_INTERNAL;
    py::gil_scoped_release release;
    compute_thread::get().run([&] {
        status = work();
        message = status < 0 ? cospec_last_error() : "";
    });
    return status;
}

py::str file_text(const char * s, size_t n) {
    PyObject * o = PyUnicode_DecodeUTF8(s, (Py_ssize_t) n, "replace");
    if (o == nullptr) {
        throw py::error_already_set();
    }
    return py::reinterpret_steal<py::str>(o);
}

py::object opt_str(const char * s) {
    return s ? py::object(file_text(s, std::strlen(s))) : py::object(py::none());
}

[[noreturn]] void raise_status(int32_t status) {
    throw native_error {status, cospec_last_error()};
}

py::object refusal(int32_t status, const char * field) {
    if (status == COSPEC_OK) {
        return py::none();
    }
    return py::make_tuple(status, field, std::string(cospec_last_error()));
}

} // namespace cospec_python
