// llama.cpp's RPC backend, through ggml's backend registry (present when llama.cpp was built with
// GGML_RPC=on): devices of remote rpc servers for the target, and the server side.
#include "rpc.h"

#include "internal.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <netdb.h>
#include <poll.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>
#include <algorithm>

namespace {

void on_ggml_abort(const char * message);

void install_abort_hook() {
    static std::once_flag once;
    std::call_once(once, [] { ggml_set_abort_callback(on_ggml_abort); });
}

// A ggml abort on a thread inside an `aborts_throw` scope.
struct ggml_failure : std::runtime_error {
    using std::runtime_error::runtime_error;
};

thread_local bool t_aborts_throw = false;

void on_ggml_abort(const char * message) {
    if (t_aborts_throw) {
        t_aborts_throw = false; // one throw per scope: cleanup code must not throw again
        throw ggml_failure(message);
    }
    std::fprintf(stderr, "%s\n", message); // ggml's own behaviour, before it aborts
}

// While alive, a ggml abort on this thread throws ggml_failure instead of ending the process:
// around the RPC client's handshake, which aborts on the calling thread when a server answers
// but not as one. (A server lost mid-generation fails on the client's own worker thread, where
// nothing can be caught: that still ends the process.)
class aborts_throw {
public:
    aborts_throw() : previous(t_aborts_throw) {
        install_abort_hook();
        t_aborts_throw = true;
    }
    ~aborts_throw() { t_aborts_throw = previous; }
    aborts_throw(const aborts_throw &) = delete;
    aborts_throw & operator=(const aborts_throw &) = delete;
private:
    bool previous;
};


ggml_backend_reg_t rpc_registry() {
    ggml_backend_load_all();
    return ggml_backend_reg_by_name("RPC");
}

const char * const NO_RPC = "this llama.cpp build has no RPC backend (reinstall it with CMAKE_ARGS=\"-DGGML_RPC=on\", "
                            "as ./install.sh does)";

// Connect to host:port within `timeout_ms`: the RPC backend itself would abort the process on a
// refused connection, and wait for minutes on an unreachable host.
std::string probe(const std::string & host, const std::string & port, int timeout_ms) {
    addrinfo hints {};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo * found = nullptr;
    if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
        return std::string("cannot resolve host: ") + gai_strerror(rc);
    }
    std::string error = "no address";
    for (addrinfo * a = found; a != nullptr; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) {
            error = std::strerror(errno);
            continue;
        }
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL, 0) | O_NONBLOCK);
        int rc = connect(fd, a->ai_addr, a->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS) {
            pollfd p {fd, POLLOUT, 0};
            rc = poll(&p, 1, timeout_ms);
            if (rc == 0) {
                error = "no answer within " + std::to_string(timeout_ms / 1000) + " s";
                close(fd);
                continue;
            }
            int so_error = 0;
            socklen_t len = sizeof(so_error);
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len);
            rc = so_error == 0 ? 0 : -1;
            errno = so_error;
        }
        if (rc == 0) {
            close(fd);
            freeaddrinfo(found);
            return "";
        }
        error = std::strerror(errno);
        close(fd);
    }
    freeaddrinfo(found);
    return error;
}

} // namespace

namespace cospec {

int32_t rpc_devices(const std::string & servers, std::vector<ggml_backend_dev_t> & out) {
    ggml_backend_reg_t reg = rpc_registry();
    if (reg == nullptr) {
        return fail(COSPEC_ERR_INVALID_ARGUMENT, NO_RPC);
    }
    using add_server_fn = ggml_backend_reg_t (*)(const char * endpoint);
    auto add_server = (add_server_fn) ggml_backend_reg_get_proc_address(reg, "ggml_backend_rpc_add_server");
    if (add_server == nullptr) {
        return fail(COSPEC_ERR_INVALID_ARGUMENT, NO_RPC);
    }
    size_t start = 0;
    while (start <= servers.size()) {
        size_t end = servers.find(',', start);
        std::string endpoint = servers.substr(start, end == std::string::npos ? std::string::npos : end - start);
        start = end == std::string::npos ? servers.size() + 1 : end + 1;
        const size_t colon = endpoint.rfind(':');
        if (endpoint.empty() || colon == std::string::npos || colon == 0 || colon + 1 == endpoint.size() ||
            endpoint.find_first_not_of("0123456789", colon + 1) != std::string::npos) {
            return fail(COSPEC_ERR_INVALID_ARGUMENT, "RPC server '" + endpoint + "': expected HOST:PORT");
        }
        if (std::string why = probe(endpoint.substr(0, colon), endpoint.substr(colon + 1), 5000); !why.empty()) {
            return fail(COSPEC_ERR_MODEL_LOAD, "cannot reach the RPC server at " + endpoint + ": " + why +
                                                   " (is `cospec-local rpc-server` running there?)");
        }
        ggml_backend_reg_t server = nullptr;
        try {
            aborts_throw guard;
            server = add_server(endpoint.c_str());
        } catch (const ggml_failure & ex) {
            return fail(COSPEC_ERR_MODEL_LOAD, "the RPC server at " + endpoint + " did not answer as one: " + ex.what());
        }
        if (server == nullptr || ggml_backend_reg_dev_count(server) == 0) {
            return fail(COSPEC_ERR_MODEL_LOAD, "the RPC server at " + endpoint + " offers no device");
        }
        for (size_t i = 0; i < ggml_backend_reg_dev_count(server); ++i) {
            out.push_back(ggml_backend_reg_dev_get(server, i));
        }
    }
    return COSPEC_OK;
}

} // namespace cospec

extern "C" {

bool cospec_supports_rpc(void) {
    return rpc_registry() != nullptr;
}

int32_t cospec_rpc_server_run(const char * host, int32_t port, int32_t n_threads, const char * cache_dir) {
    cospec::clear_error();
    if (host == nullptr || host[0] == '\0' || port <= 0 || port > 65535 || n_threads < 0) {
        return cospec::fail(COSPEC_ERR_INVALID_ARGUMENT, "cospec_rpc_server_run: a host, a port in 1..65535 and "
                                                         "n_threads >= 0 are required");
    }
    ggml_backend_reg_t reg = rpc_registry();
    using start_fn = void (*)(const char *, const char *, size_t, size_t, ggml_backend_dev_t *);
    auto start = reg ? (start_fn) ggml_backend_reg_get_proc_address(reg, "ggml_backend_rpc_start_server") : nullptr;
    if (start == nullptr) {
        return cospec::fail(COSPEC_ERR_INVALID_ARGUMENT, NO_RPC);
    }
    // As llama.cpp's rpc-server: this machine's accelerators, else its CPU.
    std::vector<ggml_backend_dev_t> devices;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(i);
        const auto type = ggml_backend_dev_type(dev);
        if (type != GGML_BACKEND_DEVICE_TYPE_CPU && type != GGML_BACKEND_DEVICE_TYPE_ACCEL &&
            ggml_backend_dev_backend_reg(dev) != reg) {
            devices.push_back(dev);
        }
    }
    if (devices.empty()) {
        if (ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU)) {
            devices.push_back(cpu);
        }
    }
    if (devices.empty()) {
        return cospec::fail(COSPEC_ERR_INTERNAL, "no device to serve");
    }
    const std::string endpoint = std::string(host) + ":" + std::to_string(port);
    const size_t threads = n_threads > 0 ? (size_t) n_threads : std::max(1u, std::thread::hardware_concurrency());
    start(endpoint.c_str(), cache_dir, threads, devices.size(), devices.data()); // returns only if it cannot listen
    return cospec::fail(COSPEC_ERR_INTERNAL, "the RPC server could not listen on " + endpoint);
}

} // extern "C"
