#include "tensor/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace lathe {
namespace {

thread_local bool t_in_parallel = false;  // nested parallel_for calls run inline

class Pool {
 public:
  explicit Pool(int n) : n_(std::max(1, n)) {
    for (int i = 1; i < n_; ++i) workers_.emplace_back([this, i] { loop(i); });
  }
  ~Pool() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int size() const { return n_; }

  void run(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
    std::lock_guard run_lock(run_mu_);  // one parallel region at a time; nested calls run inline
    const int64_t chunks = std::min<int64_t>(n_, (n + grain - 1) / grain);
    if (chunks <= 1) {
      fn(0, n);
      return;
    }
    int64_t per = (n + chunks - 1) / chunks;
    per = (per + grain - 1) / grain * grain;
    {
      std::lock_guard lock(mu_);
      fn_ = &fn;
      total_ = n;
      per_ = per;
      chunks_ = chunks;
      pending_.store(static_cast<int>(chunks - 1));
      ++generation_;
    }
    cv_.notify_all();
    fn(0, std::min(per, n));  // the caller takes chunk 0
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [&] { return pending_.load() == 0; });
    fn_ = nullptr;
  }

 private:
  void loop(int index) {
    t_in_parallel = true;
    uint64_t seen = 0;
    for (;;) {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (index >= chunks_) continue;
      const auto* fn = fn_;
      const int64_t b = index * per_, e = std::min(total_, b + per_);
      lock.unlock();
      if (b < e) (*fn)(b, e);
      if (pending_.fetch_sub(1) == 1) {
        std::lock_guard l2(mu_);
        done_cv_.notify_one();
      }
    }
  }

  int n_;
  std::vector<std::thread> workers_;
  std::mutex mu_, run_mu_;
  std::condition_variable cv_, done_cv_;
  bool stop_ = false;
  uint64_t generation_ = 0;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t total_ = 0, per_ = 0, chunks_ = 0;
  std::atomic<int> pending_{0};
};

int g_requested = 0;

Pool& pool() {
  static Pool p([] {
    if (g_requested > 0) return g_requested;
    if (const char* env = std::getenv("LATHE_THREADS")) {
      int v = std::atoi(env);
      if (v > 0) return v;
    }
    return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }());
  return p;
}

}  // namespace

int num_threads() { return pool().size(); }
void set_num_threads(int n) { g_requested = n; }

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
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
  pool().run(n, grain, fn);
}

}  // namespace lathe
