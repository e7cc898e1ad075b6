// Which model names a request may send: the served id, the directory name and --alias names; anything else is
// 404 model_not_found listing them (unless --accept-any-model). A request without "model" is served.
#pragma once
#include <nlohmann/json.hpp>

#include "server/server_context.h"

namespace lathe::server {

void check_model_name(const ServerContext& ctx, const nlohmann::ordered_json& body);

}  // namespace lathe::server
