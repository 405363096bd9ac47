// llama.cpp's RPC backend: the target's layers on rpc servers of the same llama.cpp build.
#pragma once

#include "ggml-backend.h"

#include <string>
#include <vector>

namespace cospec {

// The devices of the RPC servers in `servers` ("HOST:PORT[,HOST:PORT...]"), each server first
// reached within a few seconds. Returns a status; on failure the message names the server.
int32_t rpc_devices(const std::string & servers, std::vector<ggml_backend_dev_t> & out);

} // namespace cospec
