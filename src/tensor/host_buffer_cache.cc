#include "tensor/host_buffer_cache.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <list>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/env.h"
#include "common/error.h"
#include "common/os_error.h"

namespace lathe {
namespace {

constexpr size_t kMinCached = size_t{64} << 10;  // smaller blocks are glibc's (its per-thread caches do well)

// Sizes round up to one of eight steps per power of two (at most 12.5% more): a prompt's last, shorter chunk
// then reuses the buffers of the full chunks before it.
size_t size_class(size_t bytes) {
  if (bytes <= kMinCached) return kMinCached;
  const int top = 63 - __builtin_clzll(bytes - 1);  // bytes - 1 < 2^(top+1)
  const size_t step = size_t{1} << (top - 3);
  return (bytes + step - 1) / step * step;
}

size_t default_cap() {
  if (const int64_t mb = env_int("LATHE_HOST_BUFFER_CACHE_MB", -1); mb >= 0) return static_cast<size_t>(mb) << 20;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  const size_t phys = pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : size_t{4} << 30;
  return std::clamp(phys / 16, size_t{64} << 20, size_t{4} << 30);
}

// Free buffers by class, the most recently freed of a class taken first; over the cap, the least recently freed
// of all go back to the heap.
class Cache {
 public:
  static Cache& get() {
    static Cache* c = new Cache;  // never destroyed: tensors may be freed during static destruction
    return *c;
  }
  size_t cap() const { return cap_; }
  void* take(size_t cls) {
    const std::lock_guard<std::mutex> lock(mu_);
    auto it = by_class_.find(cls);
    if (it == by_class_.end() || it->second.empty()) return nullptr;
    const auto entry = it->second.back();
    it->second.pop_back();
    void* p = entry->ptr;
    lru_.erase(entry);
    cached_ -= cls;
    return p;
  }
  void give(void* p, size_t cls) {
    if (cls > cap_ / 4) {  // one buffer that would push out most of the others
      std::free(p);
      return;
    }
    std::vector<void*> drop;
    {
      const std::lock_guard<std::mutex> lock(mu_);
      lru_.push_front({p, cls});
      by_class_[cls].push_back(lru_.begin());
      cached_ += cls;
      evict(cap_, drop);
    }
    for (void* q : drop) std::free(q);
  }
  void trim(size_t keep) {
    std::vector<void*> drop;
    {
      const std::lock_guard<std::mutex> lock(mu_);
      evict(keep, drop);
    }
    for (void* q : drop) std::free(q);
  }
  size_t cached() {
    const std::lock_guard<std::mutex> lock(mu_);
    return cached_;
  }

 private:
  struct Entry {
    void* ptr;
    size_t cls;
  };
  using List = std::list<Entry>;
  void evict(size_t keep, std::vector<void*>& drop) {
    while (cached_ > keep) {
      const Entry e = lru_.back();
      auto& q = by_class_[e.cls];  // its oldest is this one: a class's entries are in freeing order
      q.pop_front();
      lru_.pop_back();
      cached_ -= e.cls;
      drop.push_back(e.ptr);
    }
  }
  const size_t cap_ = default_cap();
  std::mutex mu_;
  List lru_;  // most recently freed first
  std::unordered_map<size_t, std::deque<List::iterator>> by_class_;
  size_t cached_ = 0;
};

}  // namespace

void* acquire_host_buffer(size_t bytes, size_t* capacity) {
  size_t cls = std::max<size_t>((bytes + 63) / 64 * 64, 64);
  void* p = nullptr;
  if (cls >= kMinCached) {
    cls = size_class(cls);
    p = Cache::get().take(cls);
  }
  if (!p) {
    p = std::aligned_alloc(64, cls);
    // ENOMEM: the server's 503 insufficient_memory (server/api_error.h), not a 500.
    if (!p) throw OsError(ENOMEM, "out of host memory allocating " + std::to_string(bytes) + " bytes");
    // A new buffer of a megabyte or more is about to be written whole (a first chunk's activations): its pages
    // in one call (4,000-token prefill of the 0.6B shape: 113 k -> 14 k faults, ~5% less CPU time).
    if (cls >= (size_t{1} << 20)) populate_host_pages(p, bytes);
  }
  *capacity = cls;
  return p;
}

void release_host_buffer(void* p, size_t capacity) {
  if (capacity >= kMinCached)
    Cache::get().give(p, capacity);
  else
    std::free(p);
}

void populate_host_pages(void* p, size_t bytes) {
#ifdef MADV_POPULATE_WRITE
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t lo = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + bytes) / page * page;
  if (hi > lo) (void)madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_POPULATE_WRITE);
#else
  (void)p;
  (void)bytes;
#endif
}

void trim_host_buffers(size_t keep_bytes) { Cache::get().trim(keep_bytes); }
size_t host_buffer_cached_bytes() { return Cache::get().cached(); }
size_t host_buffer_cache_cap() { return Cache::get().cap(); }

}  // namespace lathe
