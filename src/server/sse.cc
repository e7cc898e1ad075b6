#include "server/sse.h"

#include <httplib.h>

#include "server/http_server.h"

namespace lathe::server {

std::string sse_frame(const nlohmann::json& data, const std::string& event) {
  std::string out;
  if (!event.empty()) out += "event: " + event + "\n";
  out += "data: " + dump_json(data) + "\n\n";
  return out;
}

bool sse_send(httplib::DataSink& sink, const std::string& frame) { return sink.write(frame.data(), frame.size()); }

void set_sse_headers(httplib::Response& res) {
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
}

}  // namespace lathe::server
