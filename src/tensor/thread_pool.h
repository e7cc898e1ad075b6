// A fixed pool of worker threads for data-parallel kernels. parallel_for splits [0, n) into contiguous
// chunks, runs them on the workers and the caller, and returns when all are done.
//
// Threads meet at spinning barriers: a worker that finishes a chunk spins on the job counter for a while
// (LATHE_SPIN_US, default 2000 µs) before it sleeps, so the many small regions of one forward pass cost about
// a microsecond each instead of a futex wake-up; between requests the workers sleep. Chunks are claimed
// dynamically, so a worker the OS has not scheduled never stalls the caller; by default one per thread (each
// claim is a cache-line round trip between cores: 1-row decode +3-5% over two per thread, +4% before that from
// two over four); callers with long or uneven regions ask for more (a prefill's matrix products two, causal
// attention eight: attention_chunks_per_thread).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>

namespace lathe {

int num_threads();
void set_num_threads(int n);  // takes effect before the first parallel_for
// The default thread count: the CPUs this process may run on (sched_getaffinity), or LATHE_THREADS.
int default_num_threads();

// fn(begin, end) is called on disjoint ranges covering [0, n). Ranges are multiples of `grain` except the last.
// At most `chunks_per_thread` ranges per thread (see above).
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn, int chunks_per_thread = 1);

// The pool behind parallel_for; a separate instance (any thread count) is for tests. run() does not make the
// calling thread's nested parallel_for calls inline: use parallel_for for that.
class ThreadPool {
 public:
  explicit ThreadPool(int threads);  // the caller plus threads - 1 workers
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  int size() const;
  void run(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn, int chunks_per_thread = 1);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lathe
