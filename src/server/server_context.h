// What every route handler shares: the served model's session, the engine thread, metrics and the options
// `lathe serve` was started with.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/chat_session.h"
#include "server/engine_service.h"
#include "server/generation_settings.h"
#include "server/metrics.h"

namespace lathe::server {

struct ServeOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;                        // empty: no authentication (serve refuses an empty given key)
  size_t max_queue = 64;                      // waiting generations before 429
  size_t max_body_bytes = 16u << 20;          // larger request bodies get 413
  size_t http_threads = 2048;                 // connection threads (each open connection holds one)
  double shutdown_timeout_s = 10;             // on SIGTERM/SIGINT: how long running generations may finish
  ServerDefaults defaults;                    // sampling and max_tokens when a request omits them
  nlohmann::ordered_json chat_template_args;  // extra template variables (request kwargs win)
  std::string model_id;                       // reported in responses and /v1/models
};

class ServerContext {
 public:
  ServerContext(ServeOptions options, std::unique_ptr<ChatSession> session);

  ChatSession& session() { return *session_; }
  EngineService& engine() { return *engine_; }
  Metrics& metrics() { return metrics_; }
  const ServeOptions& options() const { return options_; }
  const std::string& model_id() const { return options_.model_id; }
  int64_t started_at() const { return started_at_; }
  // The chat template splits reasoning with <think> tags (Qwen3-style enable_thinking).
  bool think_tags() const { return think_tags_; }
  int64_t context_length() const;
  std::string next_request_id();
  // Shutdown's deadline passed: queued and running generations are cancelled, template renders stop.
  void cancel_all() {
    stopping_.store(true);
    engine_->cancel_all();
  }
  const std::atomic<bool>& stopping() const { return stopping_; }

 private:
  ServeOptions options_;
  std::unique_ptr<ChatSession> session_;
  Metrics metrics_;
  std::unique_ptr<EngineService> engine_;
  int64_t started_at_;
  bool think_tags_ = false;
  std::atomic<uint64_t> request_counter_{0};
  std::atomic<bool> stopping_{false};
};

}  // namespace lathe::server
