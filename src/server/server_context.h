// What every route handler shares: the served model's session, the engine thread, metrics and the options
// `lathe serve` was started with.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/chat_session.h"
#include "engine/model_bundle.h"
#include "engine/scheduler.h"
#include "lora/adapter_manager.h"
#include "server/cors.h"
#include "server/engine_service.h"
#include "server/generation_settings.h"
#include "server/metrics.h"

namespace lathe::server {

// The SSD tier of the prompt cache (serve --ssd-cache*); off while dir is empty.
struct SsdCacheOptions {
  std::string dir;
  uint64_t max_bytes = 8ull << 30;
  bool verify = false;
  double demote_idle_s = 0;
  double write_behind_s = 1.0;
  std::string template_source;  // --chat-template's text: part of the identity
  RestoreCostOptions restore;   // --ssd-restore, --ssd-read-rate, --prefill-rate
};

struct ServeOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;                        // empty: no authentication (serve refuses an empty given key)
  size_t max_queue = 64;                      // waiting generations before 429
  SchedulerOptions scheduler;                 // batch rows/tokens, prefill chunk, KV budget
  size_t max_body_bytes = 16u << 20;          // larger request bodies get 413
  size_t http_threads = 256;                  // workers that run fully read requests
  double shutdown_timeout_s = 10;             // on SIGTERM/SIGINT: how long running generations may finish
  ServerDefaults defaults;                    // sampling and max_tokens when a request omits them
  nlohmann::ordered_json chat_template_args;  // extra template variables (request kwargs win)
  std::string model_id;                       // reported in responses and /v1/models
  std::string data_dir;                       // jobs database and logs (empty: $XDG_DATA_HOME/lathe)
  bool web_ui = true;                         // GET / serves the embedded web UI (--no-ui turns it off)
  std::vector<std::string> adapter_stores;    // --adapter-dir: where mounts by path may read ([lora])
  std::vector<std::string> job_roots;         // --job-root: where job configs' paths must lie (empty: anywhere)
  std::vector<std::string> adapter_paths;     // --adapter: mounted at start (the stack is the default)
  CorsPolicy cors;                            // browser origins allowed (loopback by default)
  std::vector<std::string> allowed_hosts;     // --allowed-host: Host names answered besides loopback ones
  std::vector<std::string> model_names;       // names a request's "model" may use (model_id first)
  bool accept_any_model = false;              // any "model" is served (else 404 model_not_found)
  SsdCacheOptions ssd;                        // --ssd-cache: KV files that outlive the process
};

class ServerContext {
 public:
  ServerContext(ServeOptions options, std::unique_ptr<ModelBundle> session);

  ModelBundle& session() { return *session_; }
  EngineService& engine() { return *engine_; }
  Metrics& metrics() { return metrics_; }
  const SsdStore* ssd_store() const { return ssd_.get(); }  // null without --ssd-cache
  lora::AdapterManager& adapters() { return *adapters_; }
  const lora::AdapterManager& adapters() const { return *adapters_; }
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
  std::unique_ptr<ModelBundle> session_;
  Metrics metrics_;
  std::unique_ptr<SsdStore> ssd_;  // outlives the engine, whose writer saves into it
  std::unique_ptr<EngineService> engine_;
  std::unique_ptr<lora::AdapterManager> adapters_;
  int64_t started_at_;
  bool think_tags_ = false;
  std::atomic<uint64_t> request_counter_{0};
  std::atomic<bool> stopping_{false};
};

}  // namespace lathe::server
