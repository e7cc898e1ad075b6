// Server counters and latency histograms, rendered in the Prometheus text format for GET /metrics.
#pragma once
#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "engine/scheduler.h"

namespace lathe::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  // Appends _bucket/_sum/_count lines for `name`.
  void render(const std::string& name, std::string& out) const;

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();

  void request_finished(const std::string& endpoint, int status);
  void tokens(uint64_t prompt, uint64_t generated);
  void cancelled() { cancelled_.fetch_add(1, std::memory_order_relaxed); }
  void first_token(double seconds) { ttft_.observe(seconds); }
  void inter_token(double seconds) { itl_.observe(seconds); }
  void set_queue_depth(int64_t n) { queue_depth_.store(n, std::memory_order_relaxed); }
  void add_in_flight(int64_t delta) { in_flight_.fetch_add(delta, std::memory_order_relaxed); }
  // The scheduler after each step: rows running and waiting for KV room, the step's rows and tokens.
  void set_batch(int64_t running, int64_t waiting, int64_t rows, int64_t tokens, int64_t kv_used) {
    running_rows_.store(running, std::memory_order_relaxed);
    waiting_rows_.store(waiting, std::memory_order_relaxed);
    batch_rows_.store(rows, std::memory_order_relaxed);
    batch_tokens_.store(tokens, std::memory_order_relaxed);
    kv_used_.store(kv_used, std::memory_order_relaxed);
  }
  void set_preemptions(int64_t n) { preemptions_.store(n, std::memory_order_relaxed); }
  void set_prefix_waits(int64_t n) { prefix_waits_.store(n, std::memory_order_relaxed); }
  void set_overlapped_steps(int64_t n) { overlapped_steps_.store(n, std::memory_order_relaxed); }
  // The engine thread's time split (SchedulerStats' *_seconds, cumulative).
  void set_step_times(int64_t steps, double step, double forward, double sample, double emit) {
    std::lock_guard<std::mutex> lock(mu_);
    steps_ = steps;
    step_times_ = {step, forward, sample, emit};
  }
  void set_kv_budget(int64_t bytes) { kv_budget_.store(bytes, std::memory_order_relaxed); }

  // The engine thread's prompt-cache counters, and the SSD store (thread-safe) for its own.
  void set_cache_tiers(const CacheTierStats& s) {
    std::lock_guard<std::mutex> lock(mu_);
    cache_tiers_ = s;
  }
  CacheTierStats cache_tiers() const {
    std::lock_guard<std::mutex> lock(mu_);
    return cache_tiers_;
  }
  void set_ssd_store(const SsdStore* s) { ssd_ = s; }
  const SsdStore* ssd_store() const { return ssd_; }

  std::string render() const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::atomic<uint64_t> prompt_tokens_{0}, generated_tokens_{0}, cancelled_{0};
  std::atomic<int64_t> queue_depth_{0}, in_flight_{0};
  std::atomic<int64_t> running_rows_{0}, waiting_rows_{0}, batch_rows_{0}, batch_tokens_{0}, kv_used_{0};
  std::atomic<int64_t> kv_budget_{0}, preemptions_{0}, prefix_waits_{0};
  Histogram ttft_, itl_;
  CacheTierStats cache_tiers_;          // under mu_
  std::array<double, 4> step_times_{};  // under mu_: step, forward, sample, emit
  int64_t steps_ = 0;                   // under mu_
  std::atomic<int64_t> overlapped_steps_{0};
  const SsdStore* ssd_ = nullptr;  // set once before serving
};

}  // namespace lathe::server
