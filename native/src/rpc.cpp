// llama.cpp's RPC backend, through ggml's backend registry (present when llama.cpp was built with
// GGML_RPC=on): devices of remote rpc servers for the target, and the server side.
#include "rpc.h"

#include "ggml-rpc.h"

#include "internal.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <netdb.h>
#include <mutex>
#include <poll.h>
#include <map>
#include <sys/socket.h>
#include <sys/time.h>
#include <thread>
#include <unistd.h>

namespace {

// Engines of this process using each RPC server.
std::mutex g_in_use_mutex;
std::map<std::string, int> g_in_use;

ggml_backend_reg_t rpc_registry() {
    ggml_backend_load_all();
    return ggml_backend_reg_by_name("RPC");
}

const char * const NO_RPC = "this llama.cpp build has no RPC backend (reinstall it with CMAKE_ARGS=\"-DGGML_RPC=on\", "
                            "as ./install.sh does)";

// Both ends of llama.cpp's RPC handshake (ggml-rpc.cpp: HELLO is command 14; a request is
// | command (1 byte) | size (8 bytes) | data |, a response | size (8 bytes) | data |).
constexpr uint8_t RPC_HELLO = 14;
constexpr size_t RPC_CAPS_SIZE = 24;

bool send_all(int fd, const void * data, size_t n) {
    const char * p = static_cast<const char *>(data);
    while (n > 0) {
        const ssize_t sent = send(fd, p, n, MSG_NOSIGNAL);
        if (sent <= 0) {
            return false;
        }
        p += sent;
        n -= (size_t) sent;
    }
    return true;
}

bool recv_all(int fd, void * data, size_t n) {
    char * p = static_cast<char *>(data);
    while (n > 0) {
        const ssize_t got = recv(fd, p, n, 0);
        if (got <= 0) {
            return false;
        }
        p += got;
        n -= (size_t) got;
    }
    return true;
}

// Connect to host:port and shake hands as an RPC client would, all within `timeout_ms`: the RPC
// backend itself aborts the process on a refused connection, waits for minutes on an
// unreachable host, and for ever on a server busy with another client (an rpc-server serves one
// at a time). Returns "" when the server answered as one of this build's protocol.
std::string probe(const std::string & host, const std::string & port, int timeout_ms) {
    addrinfo hints {};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo * found = nullptr;
    if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
        return std::string("cannot resolve host: ") + gai_strerror(rc);
    }
    std::string error = "no address";
    int fd = -1;
    for (addrinfo * a = found; a != nullptr && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) {
            error = std::strerror(errno);
            continue;
        }
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL, 0) | O_NONBLOCK);
        int rc = connect(fd, a->ai_addr, a->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS) {
            pollfd p {fd, POLLOUT, 0};
            rc = poll(&p, 1, timeout_ms);
            int so_error = ETIMEDOUT;
            if (rc > 0) {
                socklen_t len = sizeof(so_error);
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len);
            }
            rc = so_error == 0 ? 0 : -1;
            errno = so_error;
        }
        if (rc != 0) {
            error = errno == ETIMEDOUT ? "no answer within " + std::to_string(timeout_ms / 1000) + " s"
                                       : std::strerror(errno);
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(found);
    if (fd < 0) {
        return error;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL, 0) & ~O_NONBLOCK);
    timeval tv {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    uint8_t request[1 + 8 + RPC_CAPS_SIZE] = {};
    request[0] = RPC_HELLO;
    const uint64_t request_size = RPC_CAPS_SIZE; // no transport capabilities: plain TCP
    std::memcpy(request + 1, &request_size, sizeof(request_size));
    uint64_t response_size = 0;
    uint8_t response[4 + RPC_CAPS_SIZE] = {};
    std::string why;
    if (!send_all(fd, request, sizeof(request)) || !recv_all(fd, &response_size, sizeof(response_size)) ||
        response_size != sizeof(response) || !recv_all(fd, response, sizeof(response))) {
        why = response_size == 0 ? "it accepted the connection but did not answer the RPC handshake within " +
                                       std::to_string(timeout_ms / 1000) + " s (an rpc-server serves one client at a "
                                       "time: is another engine or program using it?)"
                                 : "it did not answer as an RPC server";
    } else if (response[0] != RPC_PROTO_MAJOR_VERSION || response[1] > RPC_PROTO_MINOR_VERSION) {
        why = "it speaks RPC protocol " + std::to_string(response[0]) + "." + std::to_string(response[1]) +
              ", this build " + std::to_string(RPC_PROTO_MAJOR_VERSION) + "." + std::to_string(RPC_PROTO_MINOR_VERSION) +
              " (use the same llama.cpp version on both machines)";
    }
    close(fd);
    return why;
}

} // namespace

namespace cospec {

int32_t rpc_devices(const std::string & servers, std::vector<ggml_backend_dev_t> & out, rpc_connections & held) {
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
        std::unique_lock<std::mutex> lock(g_in_use_mutex);
        const bool connected = g_in_use[endpoint] > 0;  // a new handshake would wait behind that connection
        lock.unlock();
        if (std::string why = connected ? "" : probe(endpoint.substr(0, colon), endpoint.substr(colon + 1), 5000);
            !why.empty()) {
            return fail(COSPEC_ERR_MODEL_LOAD, "cannot reach the RPC server at " + endpoint + ": " + why +
                                                   " (is `cospec-local rpc-server` running there?)");
        }
        ggml_backend_reg_t server = add_server(endpoint.c_str());
        if (server == nullptr || ggml_backend_reg_dev_count(server) == 0) {
            return fail(COSPEC_ERR_MODEL_LOAD, "the RPC server at " + endpoint + " offers no device");
        }
        for (size_t i = 0; i < ggml_backend_reg_dev_count(server); ++i) {
            out.push_back(ggml_backend_reg_dev_get(server, i));
        }
        lock.lock();
        g_in_use[endpoint] += 1;
        held.endpoints.push_back(endpoint);
    }
    return COSPEC_OK;
}

rpc_connections::~rpc_connections() {
    std::lock_guard<std::mutex> lock(g_in_use_mutex);
    for (const auto & endpoint : endpoints) {
        g_in_use[endpoint] -= 1;
    }
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
