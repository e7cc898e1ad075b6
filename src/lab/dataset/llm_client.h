// A small blocking HTTP/1.1 client for the served model's /v1/chat/completions on the server's own loopback
// (jobs/job_api.h), with a connect timeout, a timeout on the whole exchange and a cap on the response size.
#pragma once
#include <chrono>
#include <cstddef>
#include <string>

#include "jobs/job_api.h"
#include "jobs/job_types.h"

namespace lathe::dataset {

struct LlmClientLimits {
  std::chrono::milliseconds connect_timeout{10'000};
  std::chrono::milliseconds exchange_timeout{600'000};  // writing the request and reading the whole response
  size_t max_response_bytes = 8u << 20;
  // A busy server (429, 503: its generation queue is full) is asked again after a pause that doubles from
  // busy_pause up to 10 s, at most busy_retries times, before the call fails.
  int busy_retries = 30;
  std::chrono::milliseconds busy_pause{500};
};

struct ChatParams {
  int max_tokens = 512;
  double temperature = 0.7;
};

class LlmClient {
 public:
  // Throws InvalidArgument for a URL that is not http://host:port[/prefix].
  explicit LlmClient(jobs::JobApi api, LlmClientLimits limits = {});
  // POSTs `body` (JSON) to `path`; the response's status and body. Throws Error(Io) on a refused connection, a
  // timeout or a response over the cap.
  struct Response {
    int status = 0;
    std::string body;
  };
  Response post(const std::string& path, const std::string& body) const;
  // One chat completion, thinking off: the first choice's message content (busy answers retried, see
  // LlmClientLimits). Throws Error(Io) naming the server's error for a non-2xx answer, Corrupt for a body that is
  // not a chat completion.
  std::string chat(const jobs::json& messages, const ChatParams& params) const;
  // The same request with `extra` merged into its body (tools, tool_choice): the first choice's whole message
  // (content, tool_calls).
  jobs::json chat_message(const jobs::json& messages, const ChatParams& params, const jobs::json& extra) const;

 private:
  jobs::JobApi api_;
  LlmClientLimits limits_;
  std::string host_, port_, prefix_;
};

// The client for this process's job API, or an Unsupported error saying why there is none (a CLI run).
LlmClient job_llm_client();

}  // namespace lathe::dataset
