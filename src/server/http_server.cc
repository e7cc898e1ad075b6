#include "server/http_server.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <set>

#include <httplib.h>

#include "common/error.h"
#include "common/limits.h"
#include "common/log.h"
#include "jobs/job_api.h"
#include "server/cors.h"
#include "server/host_check.h"
#include "server/http_front.h"
#include "server/json_fields.h"

namespace lathe::server {
namespace {

Surface surface_of(const std::string& path) {
  return path.rfind("/v1/messages", 0) == 0 ? Surface::Anthropic : Surface::OpenAI;
}

bool path_matches(const Route& r, const std::string& path) {
  if (!r.prefix) return path == r.path;
  return path.size() > r.path.size() && path.rfind(r.path, 0) == 0;
}

// The metric label for a path: the route it matched, or "other" (unbounded paths must not become labels).
std::string endpoint_label(const std::vector<Route>& routes, const std::string& path) {
  for (const Route& r : routes)
    if (path_matches(r, path)) return r.prefix ? r.path + "{id}" : r.path;
  return "other";
}

bool authorized(const httplib::Request& req, const std::string& key) {
  const std::string bearer = req.get_header_value("Authorization");
  if (bearer.size() > 7 && bearer.compare(0, 7, "Bearer ") == 0 && bearer.substr(7) == key) return true;
  return req.get_header_value("x-api-key") == key;
}

thread_local std::string t_request_id;

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

const std::string& current_request_id() { return t_request_id; }

std::string dump_json(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

void write_json(httplib::Response& res, const nlohmann::ordered_json& body, int status) {
  res.status = status;
  res.set_content(dump_json(body), "application/json");
}

void write_error(httplib::Response& res, const ApiError& e, Surface surface) {
  write_json(res, surface == Surface::Anthropic ? anthropic_error_body(e) : openai_error_body(e), e.status());
  // Conditions of the moment say when to try again: a full queue (429) soon, memory (503) a little later.
  if (e.status() == 429) res.set_header("Retry-After", "1");
  if (e.status() == 503 && e.code() == "insufficient_memory") res.set_header("Retry-After", "5");
}

namespace {

// What pre_route checks a request's headers against.
struct Gate {
  std::string key;
  size_t max_body = 0;
  CorsPolicy cors;
  HostPolicy hosts;
  bool open_ui = false;  // the web UI's files are served without the key
};

// Runs before the body is read: Host (DNS rebinding), CORS preflight, foreign origins, transfer and content
// codings, declared size, API key. A refusal that sets "Connection: close" has the body drained by the front
// before the answer.
bool pre_route(const Gate& gate, const httplib::Request& req, httplib::Response& res) {
  if (req.get_header_value_count("Host") > 1) {
    write_error(res, ApiError(400, "more than one Host header"), surface_of(req.path));
    return true;
  }
  if (const std::string why = gate.hosts.refusal(req.get_header_value("Host")); !why.empty()) {
    write_error(res, ApiError(403, why), surface_of(req.path));
    return true;
  }
  // CORS next: a preflight carries no API key, and a browser can only read errors that carry the headers.
  if (apply_cors(gate.cors, req, res)) return true;
  // A page on another site can send "simple" requests (text/plain or form bodies, no preflight) and the browser
  // delivers them even though it hides the answer: without a key, every route would act for any web page the
  // user opens. So a request from an origin that is not allowed needs the API key, whatever its method.
  for (size_t i = 0, n = req.get_header_value_count("Origin"); i < n; ++i) {
    const std::string origin = req.get_header_value("Origin", i);
    if (gate.cors.allows(origin) || (!gate.key.empty() && authorized(req, gate.key))) continue;
    write_error(res,
                ApiError(403, "requests from the web origin '" + origin +
                                  "' are not allowed: browser pages may call this server only from loopback "
                                  "origins or ones given with --cors-origin" +
                                  (gate.key.empty() ? "" : " (or with the API key)")),
                surface_of(req.path));
    return true;
  }
  // Chunked bodies are read (the front caps them at --max-body-bytes as they arrive); any other transfer coding
  // would need decoding without a bound, and HTTP/1.0 has none (RFC 9112 §6.1): refused.
  if (const size_t n = req.get_header_value_count("Transfer-Encoding"); n > 0) {
    const std::string te = req.get_header_value("Transfer-Encoding");
    if (n > 1 || lower(te) != "chunked" || req.version == "HTTP/1.0") {
      res.set_header("Connection", "close");
      write_error(res,
                  ApiError(req.version == "HTTP/1.0" ? 400 : 501,
                           "Transfer-Encoding '" + te +
                               "' is not accepted: send the request body with a Content-Length or as chunked"),
                  surface_of(req.path));
      return true;
    }
  }
  // A compressed body would need inflating without a bound on the inflated size: refuse it.
  if (const std::string enc = lower(req.get_header_value("Content-Encoding")); !enc.empty() && enc != "identity") {
    res.set_header("Connection", "close");
    write_error(res,
                ApiError(415, "Content-Encoding '" + req.get_header_value("Content-Encoding") +
                                  "' is not accepted: send the request body uncompressed"),
                surface_of(req.path));
    return true;
  }
  if (req.has_header("Content-Length")) {
    const std::string len = req.get_header_value("Content-Length");
    char* end = nullptr;
    const unsigned long long n = std::strtoull(len.c_str(), &end, 10);
    if (end != len.c_str() && n > gate.max_body) {
      res.set_header("Connection", "close");
      write_error(res,
                  ApiError(413, "request body is too large (" + len + " bytes; the limit is " +
                                    std::to_string(gate.max_body) + ", see --max-body-bytes)"),
                  surface_of(req.path));
      return true;
    }
  }
  if (gate.key.empty() || req.path == "/health" || authorized(req, gate.key)) return false;
  if (gate.open_ui && (req.method == "GET" || req.method == "HEAD") && is_web_ui_path(req.path)) return false;
  write_error(res, ApiError(401, "invalid or missing API key (send Authorization: Bearer KEY or x-api-key)"),
              surface_of(req.path));
  return true;
}

}  // namespace

nlohmann::ordered_json take_json_body(const httplib::Request& req) {
  nlohmann::ordered_json body = parse_json_body(req.body);
  // The session owns the request (handlers see it const); its body is a plain string nothing reads again.
  std::string().swap(const_cast<std::string&>(req.body));
  return body;
}

namespace {

// Runs on a worker: exact routes first, then 405 for a known path, else 404.
void dispatch(ServerContext& ctx, const std::vector<Route>& routes, size_t max_body, const httplib::Request& req,
              httplib::Response& res) {
  t_request_id = ctx.next_request_id();
  res.set_header("X-Request-Id", t_request_id);
  if (req.body.size() > max_body) {  // belt and braces: the pre-routing check sees declared sizes only
    res.set_header("Connection", "close");
    write_error(res, ApiError(413, "request body is too large"), surface_of(req.path));
    return;
  }
  const std::string& method = req.method;
  std::set<std::string> allowed;
  for (const Route& r : routes) {
    if (!path_matches(r, req.path)) continue;
    if (r.method != method && !(method == "HEAD" && r.method == "GET")) {
      allowed.insert(r.method);
      continue;
    }
    try {
      r.handler(req, res);
    } catch (const std::exception& e) {
      ApiError err = api_error_from(e);
      if (err.status() >= 500) {
        log::error("request " + t_request_id + " " + req.path + ": " + err.what());
        err = ApiError(err.status(), std::string(err.what()) + " (request " + t_request_id + ")", err.param(),
                       err.code());
      }
      write_error(res, err, surface_of(req.path));
    }
    return;
  }
  if (!allowed.empty()) {
    std::string allow;
    for (const auto& m : allowed) allow += (allow.empty() ? "" : ", ") + m;
    res.set_header("Allow", allow);
    write_error(res, ApiError(405, "method " + method + " is not allowed on " + req.path + " (use " + allow + ")"),
                surface_of(req.path));
    return;
  }
  write_error(res, ApiError(404, "not found: " + method + " " + req.path), surface_of(req.path));
}

}  // namespace

size_t http_workers(const ServeOptions& options) {
  return std::clamp<size_t>(options.http_threads, options.max_queue + 8, 8192);
}

HttpServer::HttpServer(ServerContext& ctx) : ctx_(ctx) {
  auto routes = std::make_shared<std::vector<Route>>();
  for (auto* make : {&openai_routes, &anthropic_routes, &info_routes, &jobs_routes, &dataset_routes, &adapter_routes,
                     &cache_routes, &web_routes})
    for (Route& r : (*make)(ctx_)) routes->push_back(std::move(r));

  const size_t max_body = ctx_.options().max_body_bytes;
  auto gate = std::make_shared<Gate>();
  gate->key = ctx_.options().api_key;
  gate->max_body = max_body;
  gate->cors = ctx_.options().cors;
  gate->hosts.check = is_loopback_host(ctx_.options().host);
  gate->hosts.allowed = ctx_.options().allowed_hosts;
  gate->open_ui = ctx_.options().web_ui;
  FrontHooks hooks;
  hooks.pre_route = [gate](const httplib::Request& req, httplib::Response& res) { return pre_route(*gate, req, res); };
  hooks.handle = [routes, ctx = &ctx_, max_body](const httplib::Request& req, httplib::Response& res) {
    dispatch(*ctx, *routes, max_body, req, res);
  };
  hooks.run_inline = [](const httplib::Request& req) {
    return req.path == "/health" && (req.method == "GET" || req.method == "HEAD");
  };
  // Errors the front answers itself (bad request line, headers too large, busy) still get a JSON body.
  hooks.error = [](const httplib::Request& req, httplib::Response& res, int status, const std::string& message) {
    write_error(res, ApiError(status, message), surface_of(req.path));
  };
  Metrics& metrics = ctx_.metrics();
  hooks.log = [routes, &metrics](const httplib::Request& req, const httplib::Response& res) {
    metrics.request_finished(endpoint_label(*routes, req.path), res.status);
    log::debug(req.method + " " + req.path + " -> " + std::to_string(res.status));
  };
  // Only requests being handled hold a worker (streams for their whole length): enough for every queued and
  // running generation plus the quick routes beside them.
  FrontOptions fo;
  fo.workers = http_workers(ctx_.options());
  fo.max_pending = std::max<size_t>(256, fo.workers);
  fo.max_body_bytes_in_flight = std::max<uint64_t>(limits::kBodiesInFlightMaxBytes, 4 * uint64_t{max_body});
  fo.max_chunked_body_bytes = max_body;
  front_ = std::make_unique<HttpFront>(fo, std::move(hooks));
}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
  const int port = front_->bind(ctx_.options().host, ctx_.options().port);
  // Jobs (the dataset job's LLM templates) reach this server on its own address.
  jobs::set_server_job_api(ctx_.options().host, port, ctx_.options().api_key);
  return port;
}

void HttpServer::run() { front_->run(); }

void HttpServer::stop() {
  stop_job_streams();
  front_->stop();
}

}  // namespace lathe::server
