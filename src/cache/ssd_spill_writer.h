// The SSD tier's write-behind: one background thread that stores kept caches as KV files, so neither the
// decode path nor the engine's step loop ever waits for the disk. The engine hands over a shared, read-only
// cache list; while the writer reads it, `busy` is set, and the engine copies the list instead of reusing it
// in place (its buffers must not change under the writer). A bounded queue: when the disk is slower than the
// spills, the oldest pending spill is dropped (it is a cache: losing an entry costs a prefill, nothing more).
// A spill that extends a queued one (same namespace, its tokens a prefix) replaces it.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cache/ssd_store.h"

namespace lathe {

struct SpillJob {
  std::shared_ptr<const CacheList> caches;
  std::vector<int32_t> tokens;  // what the caches hold
  std::string ns;
  std::shared_ptr<std::atomic<bool>> busy;  // true from enqueue until the writer no longer reads caches
};

class SsdSpillWriter {
 public:
  explicit SsdSpillWriter(SsdStore& store, size_t max_pending = 4);
  ~SsdSpillWriter();  // finishes every queued spill, then joins
  SsdSpillWriter(const SsdSpillWriter&) = delete;
  SsdSpillWriter& operator=(const SsdSpillWriter&) = delete;

  void enqueue(SpillJob job);  // never blocks on the disk
  void drain();                // waits until every queued spill is done (tests, shutdown)
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  size_t pending() const;

 private:
  void loop();
  static void release(SpillJob& job);

  SsdStore& store_;
  size_t max_pending_;
  mutable std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<SpillJob> queue_;
  bool writing_ = false, stopping_ = false;
  std::atomic<uint64_t> dropped_{0};
  std::thread thread_;
};

}  // namespace lathe
