#include "server/http_server.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <set>

#include <httplib.h>

#include "common/error.h"
#include "common/limits.h"
#include "common/log.h"
#include "server/connection.h"
#include "server/cors.h"

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

// A refused upload is drained (not read) before the answer, like a lingering close: at most this much, and
// only while the client keeps sending.
constexpr size_t kDrainLimit = size_t{256} << 20;
constexpr int kDrainIdleMs = 1000;

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
  if (e.status() == 429) res.set_header("Retry-After", "1");
}

HttpServer::HttpServer(ServerContext& ctx) : ctx_(ctx), http_(std::make_unique<httplib::Server>()) {
  // cpp-httplib gives every open connection a thread until it closes (idle keep-alive and slow clients
  // included): the pool is sized for many of them, so that /health and new requests still find one.
  const size_t workers = std::clamp<size_t>(ctx_.options().http_threads, ctx_.options().max_queue + 8, 8192);
  http_->new_task_queue = [workers] { return new httplib::ThreadPool(workers); };
  http_->set_payload_max_length(ctx_.options().max_body_bytes);
  // No SO_REUSEPORT (two servers must not share a port silently); no Nagle delay on streamed tokens.
  http_->set_socket_options([](socket_t sock) {
    int one = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  });
  http_->set_tcp_nodelay(true);
  http_->set_keep_alive_max_count(limits::kKeepAliveMaxRequests);
  http_->set_keep_alive_timeout(limits::kKeepAliveIdleSec);
  // Silence while reading a request line, headers or body ends the connection.
  http_->set_read_timeout(limits::kHeaderReadTimeoutSec, 0);
  http_->set_write_timeout(30, 0);
  install_routes();
}

HttpServer::~HttpServer() = default;

void HttpServer::install_routes() {
  auto routes = std::make_shared<std::vector<Route>>();
  for (auto* make : {&openai_routes, &anthropic_routes, &info_routes, &jobs_routes, &adapter_routes, &cache_routes})
    for (Route& r : (*make)(ctx_)) routes->push_back(std::move(r));

  const std::string key = ctx_.options().api_key;
  const size_t max_body = ctx_.options().max_body_bytes;
  const CorsPolicy cors = ctx_.options().cors;
  http_->set_pre_routing_handler([key, max_body, cors](const httplib::Request& req, httplib::Response& res) {
    // CORS first: a preflight carries no API key, and a browser can only read errors that carry the headers.
    if (apply_cors(cors, req, res)) return httplib::Server::HandlerResponse::Handled;
    // Size checks run before httplib reads the body: it would otherwise buffer a chunked body whole, and
    // drain an oversized declared one (waiting out the read timeout when the client never sends it).
    // Header values compare case-insensitively ("Chunked" is chunked too), and any transfer coding is refused.
    if (!lower(req.get_header_value("Transfer-Encoding")).empty()) {
      res.set_header("Connection", "close");
      ConnectionWatch(req.remote_addr, req.remote_port).drain(kDrainLimit, kDrainIdleMs);
      write_error(res, ApiError(411, "send the request body with a Content-Length (chunked bodies are not accepted)"),
                  surface_of(req.path));
      return httplib::Server::HandlerResponse::Handled;
    }
    // A compressed body would be inflated by httplib without a bound on the inflated size: refuse it.
    if (const std::string enc = lower(req.get_header_value("Content-Encoding")); !enc.empty() && enc != "identity") {
      res.set_header("Connection", "close");
      ConnectionWatch(req.remote_addr, req.remote_port).drain(kDrainLimit, kDrainIdleMs);
      write_error(res,
                  ApiError(415, "Content-Encoding '" + req.get_header_value("Content-Encoding") +
                                    "' is not accepted: send the request body uncompressed"),
                  surface_of(req.path));
      return httplib::Server::HandlerResponse::Handled;
    }
    if (req.has_header("Content-Length")) {
      const std::string len = req.get_header_value("Content-Length");
      char* end = nullptr;
      const unsigned long long n = std::strtoull(len.c_str(), &end, 10);
      if (end != len.c_str() && n > max_body) {
        res.set_header("Connection", "close");
        ConnectionWatch(req.remote_addr, req.remote_port)
            .drain(std::min<unsigned long long>(n, kDrainLimit), kDrainIdleMs);
        write_error(res,
                    ApiError(413, "request body is too large (" + len + " bytes; the limit is " +
                                      std::to_string(max_body) + ", see --max-body-bytes)"),
                    surface_of(req.path));
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    if (key.empty() || req.path == "/health" || authorized(req, key))
      return httplib::Server::HandlerResponse::Unhandled;
    write_error(res, ApiError(401, "invalid or missing API key (send Authorization: Bearer KEY or x-api-key)"),
                surface_of(req.path));
    return httplib::Server::HandlerResponse::Handled;
  });

  // One dispatcher per method: exact routes first, then 405 for a known path, else 404.
  ServerContext* ctx = &ctx_;
  auto dispatch = [routes, ctx, max_body](const std::string& method) {
    return [routes, method, ctx, max_body](const httplib::Request& req, httplib::Response& res) {
      t_request_id = ctx->next_request_id();
      res.set_header("X-Request-Id", t_request_id);
      if (req.body.size() > max_body) {  // belt and braces: the pre-routing check sees declared sizes only
        write_error(res, ApiError(413, "request body is too large"), surface_of(req.path));
        return;
      }
      std::set<std::string> allowed;
      for (const Route& r : *routes) {
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
            err = ApiError(err.status(), std::string(err.what()) + " (request " + t_request_id + ")");
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
    };
  };
  // Methods with a body read it through a content reader: httplib's own body read applies an 8 KB limit to
  // form-encoded bodies (what `curl -d` sends), which would answer a valid JSON request with a misleading 413.
  auto with_body = [max_body](std::function<void(const httplib::Request&, httplib::Response&)> next) {
    return [max_body, next](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& read) {
      std::string body;
      bool too_large = false;
      read([&](const char* data, size_t n) {
        if (body.size() + n > max_body) {
          too_large = true;
          return false;
        }
        body.append(data, n);
        return true;
      });
      if (too_large) {
        res.set_header("Connection", "close");
        write_error(res, ApiError(413, "request body is too large"), surface_of(req.path));
        return;
      }
      // Handlers see the body in req.body as before. The request outlives the response (httplib keeps it
      // until the streamed content is sent), so the body is set on it rather than on a copy.
      const_cast<httplib::Request&>(req).body = std::move(body);
      next(req, res);
    };
  };
  const std::string any = ".*";
  http_->Get(any, dispatch("GET"));
  http_->Post(any, with_body(dispatch("POST")));
  http_->Put(any, with_body(dispatch("PUT")));
  http_->Delete(any, dispatch("DELETE"));
  http_->Patch(any, with_body(dispatch("PATCH")));
  http_->Options(any, dispatch("OPTIONS"));

  // Errors httplib produces itself (413 body too large, 400 bad request line) still get a JSON body.
  http_->set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string msg = "bad request";
    if (res.status == 413)
      msg = "request body is too large";
    else if (res.status == 414)
      msg = "request URI is too long";
    else if (res.status == 431)
      msg = "request headers are too large";
    else if (res.status >= 500)
      msg = "internal error";
    write_error(res, ApiError(res.status, msg), surface_of(req.path));
  });

  Metrics& metrics = ctx_.metrics();
  http_->set_logger([routes, &metrics](const httplib::Request& req, const httplib::Response& res) {
    metrics.request_finished(endpoint_label(*routes, req.path), res.status);
    log::debug(req.method + " " + req.path + " -> " + std::to_string(res.status));
  });
}

int HttpServer::bind() {
  const auto& o = ctx_.options();
  int port = o.port;
  if (port == 0) {
    port = http_->bind_to_any_port(o.host);
    if (port < 0) throw Error(ErrorKind::Io, "cannot bind " + o.host + " on any port");
  } else if (!http_->bind_to_port(o.host, port)) {
    throw Error(ErrorKind::Io, "cannot bind " + o.host + ":" + std::to_string(port) +
                                   " (is another server running there? try --port)");
  }
  return port;
}

void HttpServer::run() { http_->listen_after_bind(); }

void HttpServer::stop() {
  stop_job_streams();
  http_->stop();
}

}  // namespace lathe::server
