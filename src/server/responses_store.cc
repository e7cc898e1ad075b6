#include "server/responses_store.h"

namespace lathe::server {

void ResponsesStore::put(const std::string& id, StoredResponse r) {
  const size_t bytes = r.messages.dump().size() + r.instructions.size();
  std::lock_guard<std::mutex> lock(mu_);
  if (bytes > kMaxBytes) return;
  if (auto it = map_.find(id); it != map_.end()) {
    bytes_ -= it->second.bytes;
    lru_.erase(it->second.lru);
    map_.erase(it);
  }
  lru_.push_front(id);
  map_[id] = Entry{std::move(r), bytes, std::chrono::steady_clock::now(), lru_.begin()};
  bytes_ += bytes;
  while (bytes_ > kMaxBytes && !lru_.empty()) {
    auto old = map_.find(lru_.back());
    bytes_ -= old->second.bytes;
    map_.erase(old);
    lru_.pop_back();
  }
}

std::optional<StoredResponse> ResponsesStore::get(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.find(id);
  if (it == map_.end()) return std::nullopt;
  if (std::chrono::steady_clock::now() - it->second.at > kTtl) {
    bytes_ -= it->second.bytes;
    lru_.erase(it->second.lru);
    map_.erase(it);
    return std::nullopt;
  }
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  return it->second.value;
}

}  // namespace lathe::server
