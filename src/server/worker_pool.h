// A fixed set of threads that run fully read HTTP requests. The queue in front of them is bounded: a request
// that finds it full is refused (503) by the caller instead of waiting without bound.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace lathe::server {

class WorkerPool {
 public:
  WorkerPool(size_t threads, size_t max_pending);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Queues the task; false when max_pending tasks already wait for a thread (or the pool is shut down).
  bool try_submit(std::function<void()> task);
  // Runs what is queued, then joins the threads. Idempotent.
  void shutdown();

 private:
  void work();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  std::vector<std::thread> threads_;
  size_t max_pending_;
  bool stopping_ = false;
};

}  // namespace lathe::server
