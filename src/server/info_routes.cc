// GET /health, /v1/models, /v1/models/{id}, /metrics and the /v1 index.
#include <httplib.h>

#include "server/http_server.h"
#include "server/model_names.h"
#include "server/responses_routes.h"
#include "server/tokenize_routes.h"

namespace lathe::server {
namespace {

using json = nlohmann::ordered_json;

json model_entry(ServerContext& ctx, const std::string& id) {
  return {{"id", id},
          {"object", "model"},
          {"created", ctx.started_at()},
          {"owned_by", "lathe"},
          {"context_window", ctx.context_length()},
          {"reasoning", ctx.think_tags()}};
}

// The served id first, then the other names it answers to.
std::vector<std::string> served_names(ServerContext& ctx) {
  std::vector<std::string> names = ctx.options().model_names;
  if (names.empty()) names.push_back(ctx.model_id());
  return names;
}

}  // namespace

std::vector<Route> info_routes(ServerContext& ctx) {
  std::vector<Route> r;
  r.push_back({"GET", "/health", [](const httplib::Request&, httplib::Response& res) {
                 // Byte for byte what mlx_lm.server answers, for health checks that compare text.
                 res.set_content("{\"status\": \"ok\"}", "application/json");
               }});
  r.push_back({"GET", "/v1/models", [&ctx](const httplib::Request&, httplib::Response& res) {
                 json data = json::array();
                 for (const std::string& name : served_names(ctx)) data.push_back(model_entry(ctx, name));
                 for (const auto& a : ctx.adapters().list())  // [lora] mounted adapters, with their parent
                   data.push_back({{"id", a.id},
                                   {"object", "model"},
                                   {"created", ctx.started_at()},
                                   {"owned_by", "lathe"},
                                   {"parent", ctx.model_id()},
                                   {"root", a.dir}});
                 write_json(res, {{"object", "list"}, {"data", std::move(data)}});
               }});
  r.push_back({"GET", "/v1/models/",
               [&ctx](const httplib::Request& req, httplib::Response& res) {
                 const std::string id = req.path.substr(std::string("/v1/models/").size());
                 try {
                   check_model_name(ctx, json{{"model", id}});
                 } catch (const ApiError& e) {
                   write_error(res, e, Surface::OpenAI);
                   return;
                 }
                 write_json(res, model_entry(ctx, id));
               },
               /*prefix=*/true});
  r.push_back({"GET", "/metrics", [&ctx](const httplib::Request&, httplib::Response& res) {
                 res.set_content(ctx.metrics().render(), "text/plain; version=0.0.4");
               }});
  r.push_back({"GET", "/v1", [&ctx](const httplib::Request&, httplib::Response& res) {
                 write_json(res,
                            {{"name", "lathe"},
                             {"model", ctx.model_id()},
                             {"endpoints",
                              {"POST /v1/chat/completions", "POST /v1/completions", "POST /v1/messages",
                               "POST /v1/messages/count_tokens", "POST /v1/responses", "POST /tokenize",
                               "POST /detokenize", "GET /v1/models", "GET /v1/cache", "GET /health", "GET /metrics"}}});
               }});
  // Registered with these (http_server.cc lists route families): tokenizer utilities, count_tokens, Responses.
  for (Route& t : tokenize_routes(ctx)) r.push_back(std::move(t));
  for (Route& t : responses_routes(ctx)) r.push_back(std::move(t));
  return r;
}

}  // namespace lathe::server
