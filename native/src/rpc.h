// llama.cpp's RPC backend: the target's layers on rpc servers of the same llama.cpp build.
#pragma once

#include "ggml-backend.h"

#include <string>
#include <vector>

namespace cospec {

// The RPC servers an engine uses. While one is alive, another engine of this process reaches the
// same server through llama.cpp's one connection per server, without a handshake of its own.
struct rpc_connections {
    std::vector<std::string> endpoints;
    rpc_connections() = default;
    rpc_connections(const rpc_connections &) = delete;
    rpc_connections & operator=(const rpc_connections &) = delete;
    ~rpc_connections();
};

// The devices of the RPC servers in `servers` ("HOST:PORT[,HOST:PORT...]"), each server first
// reached and its handshake answered within a few seconds (unless this process already uses it).
// Returns a status; on failure the message names the server.
int32_t rpc_devices(const std::string & servers, std::vector<ggml_backend_dev_t> & out, rpc_connections & held);

} // namespace cospec
