// GET /health, /v1/models, /v1/models/{id}, /metrics and the /v1 index.
#include <httplib.h>

#include "server/http_server.h"

namespace lathe::server {
namespace {

using json = nlohmann::ordered_json;

json model_entry(ServerContext& ctx) {
  return {{"id", ctx.model_id()},
          {"object", "model"},
          {"created", ctx.started_at()},
          {"owned_by", "lathe"},
          {"context_window", ctx.context_length()},
          {"reasoning", ctx.think_tags()}};
}

}  // namespace

std::vector<Route> info_routes(ServerContext& ctx) {
  std::vector<Route> r;
  r.push_back({"GET", "/health", [](const httplib::Request&, httplib::Response& res) {
                 // Byte for byte what mlx_lm.server answers, for health checks that compare text.
                 res.set_content("{\"status\": \"ok\"}", "application/json");
               }});
  r.push_back({"GET", "/v1/models", [&ctx](const httplib::Request&, httplib::Response& res) {
                 json data = json::array({model_entry(ctx)});
                 for (const auto& a : ctx.adapters().list())  // [lora] mounted adapters, with their parent
                   data.push_back({{"id", a.id},
                                   {"object", "model"},
                                   {"created", ctx.started_at()},
                                   {"owned_by", "lathe"},
                                   {"parent", ctx.model_id()},
                                   {"root", a.dir}});
                 write_json(res, {{"object", "list"}, {"data", data}});
               }});
  r.push_back({"GET", "/v1/models/",
               [&ctx](const httplib::Request& req, httplib::Response& res) {
                 const std::string id = req.path.substr(std::string("/v1/models/").size());
                 if (id != ctx.model_id()) {
                   write_error(res,
                               ApiError(404, "model '" + id + "' is not served here (serving " + ctx.model_id() + ")",
                                        "model", "model_not_found"),
                               Surface::OpenAI);
                   return;
                 }
                 write_json(res, model_entry(ctx));
               },
               /*prefix=*/true});
  r.push_back({"GET", "/metrics", [&ctx](const httplib::Request&, httplib::Response& res) {
                 res.set_content(ctx.metrics().render(), "text/plain; version=0.0.4");
               }});
  r.push_back({"GET", "/v1", [&ctx](const httplib::Request&, httplib::Response& res) {
                 write_json(res, {{"name", "lathe"},
                                  {"model", ctx.model_id()},
                                  {"endpoints",
                                   {"POST /v1/chat/completions", "POST /v1/completions", "POST /v1/messages",
                                    "GET /v1/models", "GET /health", "GET /metrics"}}});
               }});
  return r;
}

}  // namespace lathe::server
