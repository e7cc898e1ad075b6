// The host buffer cache behind CPU tensors: freed buffers come back for the next one of their size class (a
// prompt's shorter last chunk reuses the full chunks' buffers), without page faults, and an idle trim gives
// them back.
#include "tensor/host_buffer_cache.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "common/os_error.h"
#include "tensor/tensor.h"

namespace lathe {
namespace {

long thread_minor_faults() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  return u.ru_minflt;
}

TEST(HostBufferCache, SizeClassesAreWithinAnEighthAndReused) {
  trim_host_buffers(0);
  size_t cap_a = 0, cap_b = 0;
  const size_t a_bytes = (size_t{3} << 20) + 4096;  // a full chunk's buffer
  void* a = acquire_host_buffer(a_bytes, &cap_a);
  EXPECT_GE(cap_a, a_bytes);
  EXPECT_LE(cap_a, a_bytes + a_bytes / 8);
  EXPECT_EQ(cap_a % 64, 0u);
  release_host_buffer(a, cap_a);
  EXPECT_EQ(host_buffer_cached_bytes(), cap_a);
  void* b = acquire_host_buffer(a_bytes - 2048, &cap_b);  // the last, shorter chunk's: same class
  EXPECT_EQ(b, a);
  EXPECT_EQ(cap_b, cap_a);
  EXPECT_EQ(host_buffer_cached_bytes(), 0u);
  release_host_buffer(b, cap_b);
  size_t cap_c = 0;
  void* c = acquire_host_buffer(a_bytes * 2, &cap_c);  // another class: a new buffer
  EXPECT_NE(c, a);
  release_host_buffer(c, cap_c);
  trim_host_buffers(0);
  EXPECT_EQ(host_buffer_cached_bytes(), 0u);
}

TEST(HostBufferCache, SmallBuffersAreLeftToTheHeap) {
  trim_host_buffers(0);
  size_t cap = 0;
  void* p = acquire_host_buffer(1000, &cap);
  EXPECT_EQ(cap, 1024u);
  release_host_buffer(p, cap);
  EXPECT_EQ(host_buffer_cached_bytes(), 0u);
}

TEST(HostBufferCache, ASecondForwardPassFaultsNoPagesAndIdleTrimFreesThem) {
  trim_host_buffers(0);
  // One "layer": the activations of a 1,024-token chunk of a 1,024-wide model (4 to 12 MiB each), made and
  // dropped layer after layer, as a forward pass does.
  const std::vector<int64_t> widths = {1024, 2048, 1024, 1024, 3072, 3072, 3072, 1024};
  auto layer = [&](int64_t tokens) {
    std::vector<Tensor> live;
    for (int64_t w : widths) {
      live.push_back(Tensor::empty({tokens, w}, DType::F32));
      std::memset(live.back().raw(), 1, live.back().nbytes());
    }
  };
  size_t bytes = 0;
  for (int64_t w : widths) bytes += static_cast<size_t>(1024 * w) * 4;
  ASSERT_LE(bytes, host_buffer_cache_cap());
  layer(1024);
  const long before = thread_minor_faults();
  for (int i = 0; i < 4; ++i) layer(i == 3 ? 1000 : 1024);  // the last chunk a little shorter
  const long faults = thread_minor_faults() - before;
  const long pages = static_cast<long>(bytes / 4096);
  EXPECT_LT(faults, pages / 20) << faults << " faults for 4 passes over " << pages << " pages";
  EXPECT_GE(host_buffer_cached_bytes(), bytes);
  trim_host_buffers(kIdleHostBufferBytes);
  EXPECT_LE(host_buffer_cached_bytes(), kIdleHostBufferBytes);
  trim_host_buffers(0);
  EXPECT_EQ(host_buffer_cached_bytes(), 0u);
}

TEST(HostBufferCache, PopulateMakesTheWholePagesAtOnce) {
  constexpr size_t kPage = 4096, kPages = 64;
  void* m = mmap(nullptr, kPages * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  auto* base = static_cast<unsigned char*>(m);
  std::vector<unsigned char> in(kPages);
  ASSERT_EQ(mincore(m, kPages * kPage, in.data()), 0);
  for (unsigned char c : in) ASSERT_EQ(c & 1, 0);
  // From the middle of page 1 to the middle of page 40: pages 2..39 are wholly inside.
  populate_host_pages(base + kPage + 100, 39 * kPage);
  ASSERT_EQ(mincore(m, kPages * kPage, in.data()), 0);
  size_t made = 0;
  for (unsigned char c : in) made += c & 1;
#ifdef MADV_POPULATE_WRITE
  void* probe = mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  const bool supported = madvise(probe, kPage, MADV_POPULATE_WRITE) == 0;
  munmap(probe, kPage);
  if (supported) {
    EXPECT_EQ(made, 38u);
    EXPECT_EQ(in[1] & 1, 0);
    EXPECT_EQ(in[2] & 1, 1);
    EXPECT_EQ(in[39] & 1, 1);
    EXPECT_EQ(in[40] & 1, 0);
  }
#endif
  (void)made;
  munmap(m, kPages * kPage);
}

// A sanitizer's allocator reports an impossible allocation instead of returning null (GCC says so with
// __SANITIZE_*__, clang with __has_feature).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define LATHE_HOST_BUFFER_NULL_ON_FAILURE 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define LATHE_HOST_BUFFER_NULL_ON_FAILURE 0
#endif
#endif
#ifndef LATHE_HOST_BUFFER_NULL_ON_FAILURE
#define LATHE_HOST_BUFFER_NULL_ON_FAILURE 1
#endif

TEST(HostBufferCache, AnAllocationTheHostCannotMakeIsAnOsErrorOfEnomem) {
  if (!LATHE_HOST_BUFFER_NULL_ON_FAILURE) GTEST_SKIP() << "the sanitizer's allocator aborts instead";
  size_t cap = 0;
  const size_t huge = size_t{1} << 62;  // more than any address space: aligned_alloc returns null
  try {
    void* p = acquire_host_buffer(huge, &cap);
    release_host_buffer(p, cap);
    ADD_FAILURE() << "nothing thrown";
  } catch (const OsError& e) {  // the server's 503 insufficient_memory (server/api_error.h)
    EXPECT_EQ(e.os_errno(), ENOMEM) << e.what();
    EXPECT_EQ(std::string(e.what()), "out of host memory allocating " + std::to_string(huge) + " bytes");
  }
}

}  // namespace
}  // namespace lathe
