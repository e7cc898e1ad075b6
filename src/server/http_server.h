// The HTTP server: the event-driven front (http_front.h) with a worker pool sized to the queue, API-key checks,
// body-size and coding checks before a body is read, one error shape per surface, 404 vs 405, request logging
// and the per-route request counter. Routes are written against cpp-httplib's Request and Response structs.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/server_context.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace lathe::server {

enum class Surface { OpenAI, Anthropic };

using RouteHandler = std::function<void(const httplib::Request&, httplib::Response&)>;
struct Route {
  std::string method;  // GET, POST or DELETE
  std::string path;    // exact path, or a prefix ending in "/" followed by an id (see `prefix`)
  RouteHandler handler;
  bool prefix = false;
};

std::vector<Route> openai_routes(ServerContext& ctx);
std::vector<Route> anthropic_routes(ServerContext& ctx);
std::vector<Route> info_routes(ServerContext& ctx);
std::vector<Route> jobs_routes(ServerContext& ctx);
// Ends every following job event stream (called by HttpServer::stop: a long job must not hold up shutdown).
void stop_job_streams();
std::vector<Route> dataset_routes(ServerContext& ctx);  // GET /api/dataset/templates
std::vector<Route> adapter_routes(ServerContext& ctx);
std::vector<Route> cache_routes(ServerContext& ctx);  // GET /v1/cache
std::vector<Route> web_routes(ServerContext& ctx);    // GET / and /ui/*: the embedded web UI (unless --no-ui)
// The web UI's own files, which need no API key.
bool is_web_ui_path(const std::string& path);
// The request's adapter set ([lora]): `adapter` when given, else `model` when it names mounted adapters, else
// the server's default; pinned for the whole generation. Null for the base model.
std::shared_ptr<const lora::ForwardContext> select_adapters(ServerContext& ctx, const std::string& adapter,
                                                            const std::string& model);

// The worker threads the HTTP front runs requests on: --http-threads, at least --max-queue + 8.
size_t http_workers(const ServeOptions& options);

void write_json(httplib::Response& res, const nlohmann::ordered_json& body, int status = 200);
// parse_json_body(req.body), then the body's bytes are released: routes that build a prompt from a large body
// do not hold its text beside the parsed copy (the request is the worker's own; nothing reads the body after
// its route has parsed it).
nlohmann::ordered_json take_json_body(const httplib::Request& req);
void write_error(httplib::Response& res, const ApiError& e, Surface surface);
// The id of the request being handled on this thread (also sent back as X-Request-Id and used in logs).
const std::string& current_request_id();
// The JSON text of a response body; invalid UTF-8 (never expected) is replaced rather than thrown on.
std::string dump_json(const nlohmann::ordered_json& j);

class HttpFront;

class HttpServer {
 public:
  explicit HttpServer(ServerContext& ctx);
  ~HttpServer();
  // Binds the configured host and port (0 = any free port); returns the port. Throws Error(Io) on failure.
  int bind();
  // Serves until stop() (from another thread or a signal handler's helper thread); returns once the requests
  // in flight have been answered.
  void run();
  // Stops accepting and closes idle connections; requests in flight finish (generations: see serve.cc).
  void stop();

 private:
  ServerContext& ctx_;
  std::unique_ptr<HttpFront> front_;
};

}  // namespace lathe::server
