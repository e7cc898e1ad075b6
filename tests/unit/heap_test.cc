// tune_heap_for_tensors: a forward pass's freed activation buffers are reused by the next one without page
// faults (glibc's defaults trimmed them back to the kernel, and every op faulted its buffers in again).
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/heap.h"

namespace lathe {
namespace {

// A sanitizer replaces glibc's allocator (GCC says so with __SANITIZE_*__, clang with __has_feature).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || !defined(__GLIBC__)
#define LATHE_HEAP_IS_GLIBC 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define LATHE_HEAP_IS_GLIBC 0
#endif
#endif
#ifndef LATHE_HEAP_IS_GLIBC
#define LATHE_HEAP_IS_GLIBC 1
#endif

#if LATHE_HEAP_IS_GLIBC
long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  return u.ru_minflt;
}

// One "forward pass": buffers the size of a 512-token prefill's activations, written, then all freed.
long faults_of_one_pass(size_t buffers, size_t bytes) {
  const long before = minor_faults();
  std::vector<void*> live;
  for (size_t i = 0; i < buffers; ++i) {
    void* p = std::malloc(bytes);
    std::memset(p, static_cast<int>(i), bytes);
    asm volatile("" : : "r"(p) : "memory");  // the writes must happen
    live.push_back(p);
  }
  for (void* p : live) std::free(p);
  return minor_faults() - before;
}
#endif

TEST(HeapTuning, FreedTensorBuffersAreReusedWithoutPageFaults) {
#if !LATHE_HEAP_IS_GLIBC
  GTEST_SKIP() << "glibc's own allocator only";
#else
  if (std::getenv("GLIBC_TUNABLES")) GTEST_SKIP() << "GLIBC_TUNABLES rules the heap here";
  tune_heap_for_tensors();
  constexpr size_t kBuffers = 12, kBytes = size_t{8} << 20;  // 96 MiB, under the 256 MiB kept
  faults_of_one_pass(kBuffers, kBytes);                      // the first pass grows the heap
  const long pages = static_cast<long>(kBuffers * kBytes / 4096);
  const long again = faults_of_one_pass(kBuffers, kBytes);
  EXPECT_LT(again, pages / 20) << "the second pass faulted " << again << " of " << pages << " pages in again";
#endif
}

}  // namespace
}  // namespace lathe
