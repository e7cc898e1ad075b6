#include "lab/dataset/llm_client.h"

#include <algorithm>
#include <optional>
#include <thread>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "common/error.h"

namespace lathe::dataset {
namespace dataset_llm_client_detail {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

}  // namespace dataset_llm_client_detail

LlmClient::LlmClient(jobs::JobApi api, LlmClientLimits limits) : api_(std::move(api)), limits_(limits) {
  const std::string& url = api_.url;
  const std::string scheme = "http://";
  if (!url.starts_with(scheme))
    throw Error(ErrorKind::InvalidArgument, "the job API URL '" + url + "' is not http://host:port");
  std::string rest = url.substr(scheme.size());
  const size_t slash = rest.find('/');
  if (slash != std::string::npos) {
    prefix_ = rest.substr(slash);
    rest.resize(slash);
  }
  while (!prefix_.empty() && prefix_.back() == '/') prefix_.pop_back();
  size_t colon = rest.rfind(':');
  if (!rest.empty() && rest.front() == '[') {  // [v6]:port
    const size_t close = rest.find(']');
    if (close == std::string::npos)
      throw Error(ErrorKind::InvalidArgument, "the job API URL '" + url + "' is malformed");
    host_ = rest.substr(1, close - 1);
    colon = close + 1 < rest.size() && rest[close + 1] == ':' ? close + 1 : std::string::npos;
  } else {
    host_ = rest.substr(0, colon);
  }
  port_ = colon == std::string::npos ? "80" : rest.substr(colon + 1);
  if (host_.empty() || port_.empty())
    throw Error(ErrorKind::InvalidArgument, "the job API URL '" + url + "' is not http://host:port");
}

LlmClient::Response LlmClient::post(const std::string& path, const std::string& body) const {
  using namespace dataset_llm_client_detail;
  asio::io_context ioc;
  tcp::resolver resolver(ioc);
  beast::tcp_stream stream(ioc);
  beast::flat_buffer buffer;
  http::request<http::string_body> req{http::verb::post, prefix_ + path, 11};
  req.set(http::field::host, (host_.find(':') != std::string::npos ? "[" + host_ + "]" : host_) + ":" + port_);
  req.set(http::field::content_type, "application/json");
  req.set(http::field::user_agent, "lathe-dataset-job");
  if (!api_.key.empty()) req.set(http::field::authorization, "Bearer " + api_.key);
  req.body() = body;
  req.prepare_payload();
  http::response_parser<http::string_body> parser;
  parser.body_limit(limits_.max_response_bytes);
  parser.header_limit(64 * 1024);

  std::optional<beast::error_code> failure;
  std::string stage = "resolve";
  auto fail = [&](beast::error_code ec) { failure = ec; };
  resolver.async_resolve(host_, port_, [&](beast::error_code ec, tcp::resolver::results_type results) {
    if (ec) return fail(ec);
    stage = "connect";
    stream.expires_after(limits_.connect_timeout);
    stream.async_connect(results, [&](beast::error_code ec2, const tcp::endpoint&) {
      if (ec2) return fail(ec2);
      stage = "exchange";
      stream.expires_after(limits_.exchange_timeout);
      http::async_write(stream, req, [&](beast::error_code ec3, size_t) {
        if (ec3) return fail(ec3);
        http::async_read_header(stream, buffer, parser, [&](beast::error_code ec4, size_t) {
          if (ec4) return fail(ec4);
          // The parser's own body limit is not applied to a Content-Length in every Boost: checked here too.
          if (const auto length = parser.content_length(); length && *length > limits_.max_response_bytes)
            return fail(http::error::body_limit);
          http::async_read(stream, buffer, parser, [&](beast::error_code ec5, size_t) {
            if (ec5) return fail(ec5);
            if (parser.get().body().size() > limits_.max_response_bytes) return fail(http::error::body_limit);
            beast::error_code ignored;
            stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
          });
        });
      });
    });
  });
  ioc.run();
  if (failure) {
    std::string why = failure->message();
    if (*failure == beast::error::timeout)
      why = stage == "connect" ? "no connection within the timeout" : "no full answer within the timeout";
    else if (*failure == http::error::body_limit)
      why = "the answer is larger than " + std::to_string(limits_.max_response_bytes) + " bytes";
    throw Error(ErrorKind::Io, "the served model at " + api_.url + " (" + stage + "): " + why);
  }
  Response r;
  r.status = static_cast<int>(parser.get().result_int());
  r.body = std::move(parser.get().body());
  return r;
}

std::string LlmClient::chat(const jobs::json& messages, const ChatParams& params) const {
  const jobs::json message = chat_message(messages, params, jobs::json::object());
  const auto content = message.find("content");
  return content != message.end() && content->is_string() ? content->get<std::string>() : std::string();
}

jobs::json LlmClient::chat_message(const jobs::json& messages, const ChatParams& params,
                                   const jobs::json& extra) const {
  jobs::json body = {{"messages", messages},
                     {"max_tokens", params.max_tokens},
                     {"temperature", params.temperature},
                     {"stream", false},
                     {"chat_template_kwargs", {{"enable_thinking", false}}}};
  for (const auto& [k, v] : extra.items()) body[k] = v;
  const std::string text = body.dump(-1, ' ', false, jobs::json::error_handler_t::replace);
  Response r = post("/v1/chat/completions", text);
  auto pause = limits_.busy_pause;
  for (int retry = 0; (r.status == 429 || r.status == 503) && retry < limits_.busy_retries; ++retry) {
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::milliseconds>(pause * 2, std::chrono::seconds(10));
    r = post("/v1/chat/completions", text);
  }
  jobs::json answer;
  try {
    answer = jobs::json::parse(r.body);
  } catch (const std::exception&) {
    if (r.status / 100 != 2) throw Error(ErrorKind::Io, "the served model answered HTTP " + std::to_string(r.status));
    throw Error(ErrorKind::Corrupt, "the served model's answer is not JSON");
  }
  if (r.status / 100 != 2) {
    std::string message;
    if (answer.contains("error") && answer["error"].is_object() && answer["error"].contains("message") &&
        answer["error"]["message"].is_string())
      message = answer["error"]["message"].get<std::string>();
    throw Error(ErrorKind::Io, "the served model answered HTTP " + std::to_string(r.status) +
                                   (message.empty() ? "" : ": " + message.substr(0, 500)));
  }
  try {
    const jobs::json& message = answer.at("choices").at(0).at("message");
    if (!message.is_object()) throw Error(ErrorKind::Corrupt, "not an object");
    return message;
  } catch (const std::exception&) {
    throw Error(ErrorKind::Corrupt, "the served model's answer has no choices[0].message");
  }
}

LlmClient job_llm_client() {
  const auto api = jobs::job_api();
  if (!api)
    throw Error(ErrorKind::Unsupported,
                "this template calls the served model, and no server is known here: submit the job to a running "
                "`lathe serve` (POST /api/jobs) instead of running it from the command line");
  return LlmClient(*api);
}

}  // namespace lathe::dataset
