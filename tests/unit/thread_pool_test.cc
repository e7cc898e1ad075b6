// The spinning, chunk-claiming thread pool: every index of a region runs exactly once whatever the grain,
// regions back to back and after the workers went to sleep, nested calls run inline, and an exception thrown
// in any chunk reaches the caller after every claimed chunk finished.
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tensor/thread_pool.h"

namespace lathe {
namespace {

void expect_each_index_once(int64_t n, int64_t grain) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  parallel_for(n, grain, [&](int64_t b, int64_t e) {
    EXPECT_TRUE(b % grain == 0) << b;
    for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
  });
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "n " << n << " i " << i;
}

// Workers block SIGINT and SIGTERM even when the pool starts before `lathe serve` blocks them (while a model
// loads): else a process-directed SIGTERM could land on a worker and kill the server without its graceful stop.
TEST(ThreadPool, WorkersNeverTakeTheStopSignals) {
  sigset_t none, old;
  sigemptyset(&none);
  pthread_sigmask(SIG_SETMASK, &none, &old);  // the creating thread has them unblocked
  std::atomic<int> worker_chunks{0}, unblocked{0};
  {
    ThreadPool pool(3);
    const std::thread::id caller = std::this_thread::get_id();
    for (int rep = 0; rep < 50 && worker_chunks.load() == 0; ++rep)
      pool.run(64, 1, [&](int64_t, int64_t) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));  // the workers get chunks too
        if (std::this_thread::get_id() == caller) return;
        sigset_t mask;
        pthread_sigmask(SIG_BLOCK, nullptr, &mask);
        ++worker_chunks;
        if (!sigismember(&mask, SIGTERM) || !sigismember(&mask, SIGINT)) ++unblocked;
      });
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  EXPECT_GT(worker_chunks.load(), 0);
  EXPECT_EQ(unblocked.load(), 0);
}

// LATHE_PIN=1 puts the pool's threads on distinct CPUs of the process's mask. (A worker started by the already
// pinned caller used to inherit its one CPU and stay there: both threads on one CPU, decode 3x slower.)
TEST(ThreadPool, PinPutsEachThreadOnItsOwnCpu) {
  cpu_set_t all;
  CPU_ZERO(&all);
  ASSERT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
  if (CPU_COUNT(&all) < 2) GTEST_SKIP() << "one CPU in this process's mask";
  const char* was = std::getenv("LATHE_PIN");
  const std::string saved = was ? was : "";
  ::setenv("LATHE_PIN", "1", 1);
  std::mutex mu;
  std::map<std::thread::id, std::vector<int>> cpus_of;  // each thread that ran a chunk: the CPUs it may run on
  std::thread([&] {                                     // the pool pins the thread that builds it: not the test's own
    ThreadPool pool(2);
    for (int rep = 0; rep < 50 && cpus_of.size() < 2; ++rep)
      pool.run(64, 1, [&](int64_t, int64_t) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));  // the worker gets chunks too
        cpu_set_t mine;
        CPU_ZERO(&mine);
        sched_getaffinity(0, sizeof(mine), &mine);
        std::vector<int> cpus;
        for (int c = 0; c < CPU_SETSIZE; ++c)
          if (CPU_ISSET(c, &mine)) cpus.push_back(c);
        std::lock_guard<std::mutex> lock(mu);
        cpus_of[std::this_thread::get_id()] = cpus;
      });
  })
      .join();
  if (was)
    ::setenv("LATHE_PIN", saved.c_str(), 1);
  else
    ::unsetenv("LATHE_PIN");
  ASSERT_EQ(cpus_of.size(), 2u) << "both threads ran chunks";
  const std::vector<int>& a = cpus_of.begin()->second;
  const std::vector<int>& b = std::next(cpus_of.begin())->second;
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_NE(a[0], b[0]) << "both threads pinned to CPU " << a[0];
}

TEST(ThreadPool, EveryIndexOnce) {
  for (int64_t n : {1, 2, 3, 17, 64, 1000, 4099})
    for (int64_t grain : {1, 4, 16}) expect_each_index_once(n, grain);
  for (int i = 0; i < 2000; ++i) expect_each_index_once(37, 1);  // back to back, as within a forward
  std::this_thread::sleep_for(std::chrono::milliseconds(30));    // the workers sleep
  expect_each_index_once(1000, 1);
}

// chunks_per_thread caps the ranges of a region (a decode step's matrix-vector products take one per thread);
// every index still runs once.
TEST(ThreadPool, ChunksPerThreadCapsTheRanges) {
  ThreadPool pool(2);
  for (int per_thread : {1, 2, 3})
    for (int64_t n : {2, 5, 64, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      std::atomic<int> ranges{0};
      pool.run(
          n, 1,
          [&](int64_t b, int64_t e) {
            ++ranges;
            for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
          },
          per_thread);
      EXPECT_LE(ranges.load(), std::min<int64_t>(2 * per_thread, n)) << per_thread << " " << n;
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1);
    }
}

TEST(ThreadPool, NestedCallsRunInline) {
  std::atomic<int64_t> total{0};
  parallel_for(8, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) parallel_for(10, 1, [&](int64_t b2, int64_t e2) { total += e2 - b2; });
  });
  EXPECT_EQ(total.load(), 80);
}

TEST(ThreadPool, ExceptionsReachTheCaller) {
  for (int64_t bad : {0, 5, 63}) {
    std::atomic<int> finished{0};
    EXPECT_THROW(parallel_for(64, 1,
                              [&](int64_t b, int64_t e) {
                                for (int64_t i = b; i < e; ++i)
                                  if (i == bad) throw std::runtime_error("chunk failed");
                                finished.fetch_add(1);
                              }),
                 std::runtime_error);
    expect_each_index_once(100, 1);  // the pool still works afterwards
  }
}

// Many workers (more than this machine's cores, so workers are preempted at every point) and back-to-back
// regions whose chunk counts alternate: a worker that saw one region exhausted must never claim a chunk of the
// next before it is published. That bug ran a chunk twice or past its range, and once left the caller waiting
// for a done count it had overshot (a hang on a 16-core machine).
TEST(ThreadPool, RegionsOfChangingSizeOnManyWorkers) {
  ThreadPool pool(16);
  std::vector<std::atomic<int>> hits(256);
  for (int r = 0; r < 20000; ++r) {
    const int64_t n = r % 2 ? 2 : 256;
    pool.run(n, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1, std::memory_order_relaxed);
    });
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(hits[static_cast<size_t>(i)].exchange(0), 1) << "region " << r << " index " << i;
  }
}

}  // namespace
}  // namespace lathe
