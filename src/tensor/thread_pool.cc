#include "tensor/thread_pool.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

#include "common/env.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LATHE_CPU_RELAX() _mm_pause()
#else
#define LATHE_CPU_RELAX() std::this_thread::yield()
#endif

namespace lathe {
namespace {

thread_local bool t_in_parallel = false;  // nested parallel_for calls run inline

using Clock = std::chrono::steady_clock;

int64_t spin_us() {
  static const int64_t us = [] {
    const int64_t v = env_int("LATHE_SPIN_US", -1);
    return v >= 0 ? v : int64_t{2000};
  }();
  return us;
}

// Pins worker i to the i-th CPU of `mask` (the process's affinity mask, read once before anything is pinned) when
// LATHE_PIN=1. Off by default: on a shared or virtual machine pinning two busy processes to the same CPU is worse
// than letting the scheduler move them. (Each thread used to read its own mask: a worker, started by the already
// pinned caller, inherited its one CPU, found no i-th and stayed there; 2-thread decode ran 3x slower.)
void maybe_pin(int index, const cpu_set_t& mask) {
  const char* env = std::getenv("LATHE_PIN");
  if (!env || std::string_view(env) != "1") return;
  int seen = 0;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &mask)) continue;
    if (seen++ == index) {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(c, &one);
      sched_setaffinity(0, sizeof(one), &one);
      return;
    }
  }
}

}  // namespace

// A parallel region is `chunks` pieces of [0, n) claimed one at a time from one atomic word (generation in the
// high 32 bits, next chunk in the low 32), by the caller and by whichever workers are awake. The caller waits
// only for chunks already claimed, so a worker the OS has not scheduled yet (a busy or oversubscribed machine)
// never holds up a region: the caller simply takes its chunks.
//
// A region's fields (fn, sizes) are rewritten by the next region, so a worker may read them only while its own
// region is still open: the caller first moves the word to a closed generation (no chunk claimable), then,
// behind a release fence, writes the fields and opens a new generation. A worker reads the fields, then an
// acquire fence, then claims with a CAS on the word it read: if any field it read was the next region's, the
// fences make the close visible to that CAS, which fails. (Without the close, a worker that saw the old region
// exhausted could read the next region's larger chunk count, claim on the old word before the caller
// published, and run a chunk that belongs to no region — one done count too many, and the caller spun forever:
// seen on a 16-core machine.)
class ThreadPool::Impl {
 public:
  explicit Impl(int n) : n_(std::max(1, n)) {
    CPU_ZERO(&cpus_);
    if (sched_getaffinity(0, sizeof(cpus_), &cpus_) != 0) CPU_ZERO(&cpus_);
    maybe_pin(0, cpus_);
    for (int i = 1; i < n_; ++i)
      workers_.emplace_back([this, i] {
        // Workers never take the stop signals: a process-directed SIGTERM or SIGINT must reach the thread that
        // waits for it (`lathe serve` blocks them once loaded, but the pool often starts while a model loads;
        // a worker with them unblocked took SIGTERM's default action and the server died without its graceful
        // stop — no SSD cache flush).
        sigset_t stop;
        sigemptyset(&stop);
        sigaddset(&stop, SIGINT);
        sigaddset(&stop, SIGTERM);
        pthread_sigmask(SIG_BLOCK, &stop, nullptr);
        loop(i);
      });
  }
  ~Impl() {
    {
      std::lock_guard lock(mu_);
      stop_.store(true);
      state_.fetch_add(uint64_t{1} << 32);
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int size() const { return n_; }

  void run(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn, int chunks_per_thread) {
    std::lock_guard run_lock(run_mu_);  // one parallel region at a time; nested calls run inline
    int64_t chunks = std::min<int64_t>(int64_t{chunks_per_thread} * n_, (n + grain - 1) / grain);
    if (chunks <= 1) {
      fn(0, n);
      return;
    }
    int64_t per = (n + chunks - 1) / chunks;
    per = (per + grain - 1) / grain * grain;
    chunks = (n + per - 1) / per;
    const uint32_t closed = static_cast<uint32_t>(state_.load() >> 32) + 1;
    state_.store((uint64_t{closed} << 32) | kClosedIndex);  // no claim on the previous word can succeed now
    std::atomic_thread_fence(std::memory_order_release);    // the close is seen before any field below
    fn_.store(&fn, std::memory_order_relaxed);
    total_.store(n, std::memory_order_relaxed);
    per_.store(per, std::memory_order_relaxed);
    chunks_.store(chunks, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    error_ = nullptr;
    const uint32_t gen = closed + 1;
    state_.store(uint64_t{gen} << 32);  // seq_cst: publishes the fields; pairs with the sleeper count
    if (sleepers_.load() > 0) {
      std::lock_guard lock(mu_);
      cv_.notify_all();
    }
    work(gen);
    for (uint32_t spins = 0; done_.load(std::memory_order_acquire) != chunks; ++spins) {
      LATHE_CPU_RELAX();
      if (spins > 4096) std::this_thread::yield();  // a worker preempted inside its chunk
    }
    if (error_) std::rethrow_exception(error_);
  }

 private:
  // Claims and runs chunks of region `gen` until none is left (or a newer region replaced it).
  void work(uint32_t gen) {
    for (;;) {
      uint64_t s = state_.load(std::memory_order_acquire);
      if (static_cast<uint32_t>(s >> 32) != gen) return;
      const int64_t idx = static_cast<int64_t>(s & 0xFFFFFFFFu);
      const int64_t chunks = chunks_.load(std::memory_order_relaxed), per = per_.load(std::memory_order_relaxed);
      const int64_t total = total_.load(std::memory_order_relaxed);
      const auto* fn = fn_.load(std::memory_order_relaxed);
      if (idx >= chunks) return;
      std::atomic_thread_fence(std::memory_order_acquire);  // pairs with the caller's fence after the close
      // A successful claim proves region `gen` is still running, so the fields read above are its own.
      if (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel)) continue;
      try {
        (*fn)(idx * per, std::min(total, (idx + 1) * per));
      } catch (...) {
        std::lock_guard lock(error_mu_);
        if (!error_) error_ = std::current_exception();
      }
      done_.fetch_add(1, std::memory_order_release);
    }
  }

  void loop(int index) {
    t_in_parallel = true;
    maybe_pin(index, cpus_);
    uint32_t seen = 0;
    auto current = [&] { return static_cast<uint32_t>(state_.load() >> 32); };
    for (;;) {
      uint32_t g = current();
      if (g == seen) {
        // Spin for the next region of this forward pass; sleep once the pool has been idle for a while.
        const auto deadline = Clock::now() + std::chrono::microseconds(spin_us());
        for (uint32_t spins = 1; (g = static_cast<uint32_t>(state_.load(std::memory_order_acquire) >> 32)) == seen;
             ++spins) {
          LATHE_CPU_RELAX();
          if ((spins & 1023) == 0 && Clock::now() > deadline) break;
        }
        if (g == seen) {
          std::unique_lock lock(mu_);
          sleepers_.fetch_add(1);
          cv_.wait(lock, [&] { return (g = current()) != seen; });
          sleepers_.fetch_sub(1);
        }
      }
      if (stop_.load()) return;
      seen = g;
      work(g);
    }
  }

  static constexpr uint64_t kClosedIndex = 0xFFFFFFFFu;  // above any chunk count: nothing to claim

  int n_;
  cpu_set_t cpus_;  // the affinity mask the pool started with (LATHE_PIN spreads its threads over it)
  std::vector<std::thread> workers_;
  std::mutex mu_, run_mu_, error_mu_;
  std::condition_variable cv_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> state_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<int64_t> done_{0}, total_{0}, per_{0}, chunks_{0};
  std::atomic<const std::function<void(int64_t, int64_t)>*> fn_{nullptr};
  std::exception_ptr error_;
};

ThreadPool::ThreadPool(int n) : impl_(std::make_unique<Impl>(n)) {}
ThreadPool::~ThreadPool() = default;
int ThreadPool::size() const { return impl_->size(); }
void ThreadPool::run(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn, int chunks_per_thread) {
  if (n <= 0) return;
  impl_->run(n, std::max<int64_t>(grain, 1), fn, std::max(1, chunks_per_thread));
}

namespace {
int g_requested = 0;

ThreadPool& pool() {
  static ThreadPool p(g_requested > 0 ? g_requested : default_num_threads());
  return p;
}
}  // namespace

int default_num_threads() {
  if (const int64_t v = env_int("LATHE_THREADS", 0); v > 0) return static_cast<int>(std::min<int64_t>(v, INT32_MAX));
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof(mask), &mask) == 0) return std::max(1, CPU_COUNT(&mask));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

int num_threads() { return pool().size(); }
void set_num_threads(int n) { g_requested = n; }

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn, int chunks_per_thread) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  if (t_in_parallel || n <= grain) {
    fn(0, n);
    return;
  }
  t_in_parallel = true;
  struct Reset {
    ~Reset() { t_in_parallel = false; }
  } reset;
  pool().run(n, grain, fn, chunks_per_thread);
}

}  // namespace lathe
