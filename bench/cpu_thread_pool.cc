// Cost of an empty parallel_for (the barrier a forward pass pays per parallel region), back to back as
// within a forward, and after an idle gap long enough that the workers went to sleep. One JSON line.
#include <chrono>
#include <cstdio>
#include <thread>

#include <nlohmann/json.hpp>

#include "tensor/thread_pool.h"

using Clock = std::chrono::steady_clock;

int main() {
  using namespace lathe;
  const int threads = num_threads();
  volatile int64_t sink = 0;
  auto empty = [&](int64_t b, int64_t e) { sink = sink + (e - b); };
  for (int i = 0; i < 1000; ++i) parallel_for(threads, 1, empty);  // warm up
  const int iters = 200000;
  auto t = Clock::now();
  for (int i = 0; i < iters; ++i) parallel_for(threads, 1, empty);
  const double hot_us = std::chrono::duration<double, std::micro>(Clock::now() - t).count() / iters;
  // After 20 ms idle the workers sleep: the first region pays the wake-up.
  double cold_us = 0;
  const int cold_iters = 20;
  for (int i = 0; i < cold_iters; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    t = Clock::now();
    parallel_for(threads, 1, empty);
    cold_us += std::chrono::duration<double, std::micro>(Clock::now() - t).count() / cold_iters;
  }
  std::printf("threads %d: empty parallel_for %.2f us back to back, %.1f us after idle\n", threads, hot_us, cold_us);
  std::printf("%s\n",
              nlohmann::json{{"threads", threads}, {"hot_us", hot_us}, {"after_idle_us", cold_us}}.dump().c_str());
  return 0;
}
