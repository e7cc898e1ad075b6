// GET / and GET /ui/<file>: the embedded web UI (web_assets.h). The files hold no secret and need no API key
// (the page asks for one and sends it on its API calls); they are served from memory only, so no request path
// reaches the file system. A strict Content-Security-Policy keeps anything a model or a job log says from
// running as script in the page.
#include <httplib.h>

#include "server/http_server.h"
#include "server/web_assets.h"

namespace lathe::server {
namespace web_routes_detail {

const char* content_type(const std::string& path) {
  auto ends = [&path](const char* suffix) {
    const std::string s(suffix);
    return path.size() >= s.size() && path.compare(path.size() - s.size(), s.size(), s) == 0;
  };
  if (ends(".html")) return "text/html; charset=utf-8";
  if (ends(".js")) return "text/javascript; charset=utf-8";
  if (ends(".css")) return "text/css; charset=utf-8";
  if (ends(".svg")) return "image/svg+xml";
  if (ends(".json")) return "application/json";
  if (ends(".png")) return "image/png";
  return "application/octet-stream";
}

// A validator per file: FNV-1a of its bytes, so a rebuilt binary with a changed file is never served stale.
std::string etag(const WebAsset& a) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < a.size; ++i) h = (h ^ a.data[i]) * 1099511628211ull;
  char buf[24];
  std::snprintf(buf, sizeof buf, "\"%016llx\"", static_cast<unsigned long long>(h));
  return buf;
}

void serve(const WebAsset& a, const httplib::Request& req, httplib::Response& res) {
  static const std::string kPolicy =
      "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
      "base-uri 'none'; form-action 'none'; frame-ancestors 'none'";
  const std::string tag = etag(a);
  res.set_header("Content-Security-Policy", kPolicy);
  res.set_header("X-Content-Type-Options", "nosniff");
  res.set_header("Referrer-Policy", "no-referrer");
  res.set_header("Cache-Control", "no-cache");  // revalidate: the ETag makes that a 304
  res.set_header("ETag", tag);
  if (req.get_header_value("If-None-Match") == tag) {
    res.status = 304;
    return;
  }
  res.set_content(std::string(reinterpret_cast<const char*>(a.data), a.size), content_type(a.path));
}

const WebAsset* find_asset(const std::string& path) {
  for (const WebAsset& a : web_assets())
    if (path == a.path) return &a;
  return nullptr;
}

}  // namespace web_routes_detail

bool is_web_ui_path(const std::string& path) { return path == "/" || path.rfind("/ui/", 0) == 0; }

std::vector<Route> web_routes(ServerContext& ctx) {
  namespace d = web_routes_detail;
  std::vector<Route> r;
  if (!ctx.options().web_ui) return r;
  r.push_back({"GET", "/", [](const httplib::Request& req, httplib::Response& res) {
                 const WebAsset* a = d::find_asset("index.html");
                 if (!a) throw ApiError(404, "this build has no web UI");
                 d::serve(*a, req, res);
               }});
  r.push_back({"GET", "/ui/",
               [](const httplib::Request& req, httplib::Response& res) {
                 const std::string name = req.path.substr(4);
                 const WebAsset* a = d::find_asset(name);
                 if (!a) throw ApiError(404, "not found: GET " + req.path);
                 d::serve(*a, req, res);
               },
               true});
  return r;
}

}  // namespace lathe::server
