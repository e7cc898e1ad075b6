// POST /tokenize and /detokenize in both llama-server's and vLLM's shapes, and Anthropic's
// POST /v1/messages/count_tokens.
#pragma once
#include <vector>

#include "server/http_server.h"

namespace lathe::server {

std::vector<Route> tokenize_routes(ServerContext& ctx);

}  // namespace lathe::server
