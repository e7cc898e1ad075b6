#include "server/server_context.h"

#include <chrono>
#include <cstdio>

#include "chat/reasoning_splitter.h"

namespace lathe::server {

ServerContext::ServerContext(ServeOptions options, std::unique_ptr<ModelBundle> session)
    : options_(std::move(options)),
      session_(std::move(session)),
      started_at_(std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
                      .count()) {
  if (const ChatTemplate* t = session_->chat_template()) think_tags_ = template_uses_think_tags(t->source_text());
  engine_ = std::make_unique<EngineService>(*session_, metrics_, options_.max_queue, options_.scheduler);
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
