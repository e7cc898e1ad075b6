// Cross-origin requests from browsers: a preflight OPTIONS on any path is answered here, before the API key is
// checked (browsers never send credentials on a preflight), and every response to an allowed origin carries
// Access-Control-Allow-Origin. By default loopback origins (http://localhost:*, 127.0.0.1, [::1]) are allowed,
// as Ollama does; --cors-origin adds origins (repeatable; "*" allows any). A request from any other origin is
// refused before routing unless the API key authenticates it (pre_route in http_server.cc).
#pragma once
#include <string>
#include <vector>

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace lathe::server {

struct CorsPolicy {
  std::vector<std::string> origins;  // exact origins ("https://app.example"), or "*"
  bool loopback = true;              // allow http(s)://localhost, 127.0.0.1 and [::1] on any port

  bool allows(const std::string& origin) const;
};

// Adds the CORS headers for req's Origin (if allowed) to res. Returns true when req is a preflight, which is
// then fully answered (204, or 403 for an origin that is not allowed).
bool apply_cors(const CorsPolicy& policy, const httplib::Request& req, httplib::Response& res);

}  // namespace lathe::server
