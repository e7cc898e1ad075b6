#include "server/server_context.h"

#include <chrono>
#include <cstdio>

#include "cache/cache_identity.h"
#include "chat/reasoning_splitter.h"
#include "common/log.h"

namespace lathe::server {

ServerContext::ServerContext(ServeOptions options, std::unique_ptr<ModelBundle> session)
    : options_(std::move(options)),
      session_(std::move(session)),
      started_at_(std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
                      .count()) {
  if (const ChatTemplate* t = session_->chat_template()) think_tags_ = template_uses_think_tags(t->source_text());
  SsdTierOptions tier;
  if (!options_.ssd.dir.empty()) {
    const CacheOptions& co = session_->cache_options();
    CacheLayout layout = probe_cache_layout(session_->model(), co);
    tier.host_snapshot = layout.device != Device::CPU;
    tier.demote_idle_s = options_.ssd.demote_idle_s;
    tier.write_behind_s = options_.ssd.write_behind_s;
    tier.device = layout.device;
    tier.restore = options_.ssd.restore;
    SsdStoreOptions so{options_.ssd.dir, options_.ssd.max_bytes, options_.ssd.verify};
    ModelBundle* bundle = session_.get();
    ssd_ = std::make_unique<SsdStore>(so, cache_identity(session_->model(), co, options_.ssd.template_source),
                                      std::move(layout), [bundle] { return bundle->make_cache(); });
    const SsdScanReport r = ssd_->scan();
    metrics_.set_ssd_store(ssd_.get());
    log::info("ssd cache: " + ssd_->root() + ": " + std::to_string(r.entries) + " entries, " +
              std::to_string(r.bytes >> 20) + " MiB (removed " + std::to_string(r.removed_tmp) + " unfinished, " +
              std::to_string(r.removed_invalid) + " invalid, " + std::to_string(r.evicted) + " over the cap)");
  }
  engine_ =
      std::make_unique<EngineService>(*session_, metrics_, options_.max_queue, options_.scheduler, ssd_.get(), tier);
  adapters_ = std::make_unique<lora::AdapterManager>(session_->model());
}

int64_t ServerContext::context_length() const { return session_->model().config().max_position_embeddings; }

std::string ServerContext::next_request_id() {
  char buf[32];
  std::snprintf(buf, sizeof buf, "req-%06llu",
                static_cast<unsigned long long>(request_counter_.fetch_add(1, std::memory_order_relaxed) + 1));
  return buf;
}

}  // namespace lathe::server
