// POST /v1/responses.
#pragma once
#include <vector>

#include "server/http_server.h"

namespace lathe::server {

std::vector<Route> responses_routes(ServerContext& ctx);

}  // namespace lathe::server
