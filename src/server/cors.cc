#include "server/cors.h"

#include <httplib.h>

#include <algorithm>

namespace lathe::server {
namespace {

// "scheme://host[:port]" with a loopback host.
bool is_loopback_origin(const std::string& origin) {
  size_t at = 0;
  if (origin.rfind("http://", 0) == 0)
    at = 7;
  else if (origin.rfind("https://", 0) == 0)
    at = 8;
  else
    return false;
  const std::string rest = origin.substr(at);
  for (const char* host : {"localhost", "127.0.0.1", "[::1]"}) {
    const std::string h = host;
    if (rest == h) return true;
    if (rest.rfind(h + ":", 0) == 0) {
      const std::string port = rest.substr(h.size() + 1);
      if (!port.empty() && port.size() <= 5 && std::all_of(port.begin(), port.end(), ::isdigit)) return true;
    }
  }
  return false;
}

}  // namespace

bool CorsPolicy::allows(const std::string& origin) const {
  if (origin.empty()) return false;
  for (const std::string& o : origins)
    if (o == "*" || o == origin) return true;
  return loopback && is_loopback_origin(origin);
}

bool apply_cors(const CorsPolicy& policy, const httplib::Request& req, httplib::Response& res) {
  const std::string origin = req.get_header_value("Origin");
  const bool preflight = req.method == "OPTIONS" && req.has_header("Access-Control-Request-Method");
  const bool any = std::find(policy.origins.begin(), policy.origins.end(), "*") != policy.origins.end();
  if (!origin.empty() && policy.allows(origin)) {
    res.set_header("Access-Control-Allow-Origin", any ? "*" : origin);
    if (!any) res.set_header("Vary", "Origin");
    res.set_header("Access-Control-Expose-Headers", "X-Request-Id, Retry-After");
  }
  if (!preflight) return false;
  if (origin.empty() || !policy.allows(origin)) {
    res.status = 403;
    res.set_content(R"j({"error":{"message":"origin not allowed (see --cors-origin)","type":"forbidden"}})j",
                    "application/json");
    return true;
  }
  res.status = 204;
  res.set_header("Access-Control-Allow-Methods", "GET, POST, PUT, PATCH, DELETE, OPTIONS");
  const std::string asked = req.get_header_value("Access-Control-Request-Headers");
  // Echo what the browser asks for (the SDKs send authorization, content-type, x-stainless-*, anthropic-*).
  res.set_header("Access-Control-Allow-Headers", asked.empty() ? "authorization, content-type, x-api-key" : asked);
  res.set_header("Access-Control-Max-Age", "600");
  return true;
}

}  // namespace lathe::server
