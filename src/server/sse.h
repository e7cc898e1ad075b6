// Server-sent events over a chunked HTTP response: frame formatting and the response headers streams use.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace httplib {
class DataSink;
struct Response;
}  // namespace httplib

namespace lathe::server {

// "data: <json>\n\n", or "event: <name>\ndata: <json>\n\n" when event is given.
std::string sse_frame(const nlohmann::json& data, const std::string& event = {});
// Writes one frame; false when the client has gone away.
bool sse_send(httplib::DataSink& sink, const std::string& frame);
void set_sse_headers(httplib::Response& res);

}  // namespace lathe::server
