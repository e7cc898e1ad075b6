#include "cache/ssd_spill_writer.h"

#include <algorithm>

#include "common/log.h"

namespace lathe {

SsdSpillWriter::SsdSpillWriter(SsdStore& store, size_t max_pending)
    : store_(store), max_pending_(std::max<size_t>(1, max_pending)) {
  thread_ = std::thread([this] { loop(); });
}

SsdSpillWriter::~SsdSpillWriter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void SsdSpillWriter::release(SpillJob& job) {
  job.caches.reset();
  if (job.busy) job.busy->store(false, std::memory_order_release);
}

void SsdSpillWriter::enqueue(SpillJob job) {
  if (!job.caches || job.tokens.empty()) return;
  if (job.busy) job.busy->store(true, std::memory_order_release);
  std::vector<SpillJob> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // A queued spill this one extends is superseded: one growing file per conversation.
    for (auto it = queue_.begin(); it != queue_.end();) {
      const bool prefix = it->ns == job.ns && it->tokens.size() <= job.tokens.size() &&
                          std::equal(it->tokens.begin(), it->tokens.end(), job.tokens.begin());
      if (prefix) {
        gone.push_back(std::move(*it));
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
    while (queue_.size() >= max_pending_) {
      gone.push_back(std::move(queue_.front()));
      queue_.pop_front();
      dropped_.fetch_add(1, std::memory_order_relaxed);
    }
    queue_.push_back(std::move(job));
  }
  for (SpillJob& g : gone) release(g);
  cv_.notify_all();
}

void SsdSpillWriter::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [&] { return queue_.empty() && !writing_; });
}

size_t SsdSpillWriter::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size() + (writing_ ? 1 : 0);
}

void SsdSpillWriter::loop() {
  for (;;) {
    SpillJob job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything queued is written
      job = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
    }
    store_.save(job.tokens, *job.caches, job.ns);  // never throws; failures are logged once and counted
    release(job);
    {
      std::lock_guard<std::mutex> lock(mu_);
      writing_ = false;
    }
    idle_cv_.notify_all();
  }
}

}  // namespace lathe
