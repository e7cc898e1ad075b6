// Memory bandwidth of this machine, for reading decode figures as a fraction of what the memory can deliver.
// Standalone (no lathe code, so it measures the same thing whichever lathe binary is benchmarked):
//   c++ -O3 -march=native -pthread bench/peers/membw.cc -o membw && ./membw [threads] [MiB per buffer] [reps]
// Prints one JSON object: for T threads, each owning a slice of two buffers (first touched by that thread),
//   copy_gb_s  STREAM-style copy, bytes read + bytes written per second (memcpy of each slice);
//   read_gb_s  bytes read per second summing 64-bit words (what a decode GEMV does with its weights);
// best of `reps` passes each. The buffers (default 256 MiB each) are far larger than the last-level cache.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Runs fn(thread index) on `threads` threads that start together; returns the wall seconds of the slowest.
template <class Fn>
double timed_parallel(int threads, Fn fn) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<double> end(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) {
      }
      fn(t);
      end[t] = now_s();
    });
  }
  while (ready.load() != threads) {
  }
  const double start = now_s();
  go.store(true, std::memory_order_release);
  for (auto& th : pool) th.join();
  return *std::max_element(end.begin(), end.end()) - start;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  const size_t mib = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 256;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 10;
  const size_t bytes = mib << 20, slice = bytes / threads / 64 * 64;
  auto* a = static_cast<uint8_t*>(std::aligned_alloc(4096, bytes));
  auto* b = static_cast<uint8_t*>(std::aligned_alloc(4096, bytes));
  if (!a || !b) return 1;
  timed_parallel(threads, [&](int t) {  // first touch by the thread that will use the slice
    std::memset(a + t * slice, 1, slice);
    std::memset(b + t * slice, 2, slice);
  });
  double copy_best = 1e30, read_best = 1e30;
  std::vector<uint64_t> sums(threads * 8);
  for (int r = 0; r < reps; ++r) {
    copy_best =
        std::min(copy_best, timed_parallel(threads, [&](int t) { std::memcpy(b + t * slice, a + t * slice, slice); }));
    read_best = std::min(read_best, timed_parallel(threads, [&](int t) {
                           const auto* p = reinterpret_cast<const uint64_t*>(a + t * slice);
                           const size_t n = slice / 8;
                           uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
                           for (size_t i = 0; i < n; i += 4) {
                             s0 += p[i];
                             s1 += p[i + 1];
                             s2 += p[i + 2];
                             s3 += p[i + 3];
                           }
                           sums[t * 8] += s0 + s1 + s2 + s3;
                         }));
  }
  uint64_t check = 0;
  for (int t = 0; t < threads; ++t) check += sums[t * 8];
  const double moved = static_cast<double>(slice) * threads;
  std::printf(
      "{\"threads\": %d, \"buffer_mib\": %zu, \"reps\": %d, \"copy_gb_s\": %.2f, \"read_gb_s\": %.2f, "
      "\"check\": %llu}\n",
      threads, mib, reps, 2 * moved / copy_best / 1e9, moved / read_best / 1e9,
      static_cast<unsigned long long>(check % 1000));
  std::free(a);
  std::free(b);
  return 0;
}
