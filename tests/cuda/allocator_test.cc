// The caching allocator's segments: blocks of sizes it has not held before (a wave of K/V buffers growing at
// once) are carved from shared segments — few cudaMalloc calls, no two blocks overlapping — and a segment goes
// back to the driver once every block carved from it is free.
#include <vector>

#include "cuda/cuda_test_util.h"
#include "tensor/device_memory.h"
#include "tensor/tensor.h"

namespace lathe {
namespace {

TEST(CudaAllocator, NewSizesAreCarvedFromSegmentsWithoutOverlap) {
  LATHE_REQUIRE_GPU();
  // 48 distinct sizes of 600 KiB and up (each its own size class): ~29 MiB in all.
  const uint64_t before = device_memory_stats().malloc_calls;
  std::vector<Tensor> blocks;
  for (int k = 0; k < 48; ++k) {
    const int64_t n = (600 << 10) / 4 + 128 * k;  // floats
    std::vector<float> v(static_cast<size_t>(n), static_cast<float>(k + 1));
    blocks.push_back(Tensor::from_floats(v, {n}).to(Device::CUDA));
  }
  // One segment holds them all; a second where the one being carved was nearly full.
  EXPECT_LE(device_memory_stats().malloc_calls - before, 2u);
  for (size_t k = 0; k < blocks.size(); ++k) {
    const std::vector<float> back = blocks[k].to_floats();
    ASSERT_EQ(back.front(), static_cast<float>(k + 1));
    ASSERT_EQ(back.back(), static_cast<float>(k + 1)) << "block " << k << " was overwritten by its neighbour";
  }
  const size_t held = device_memory_stats().reserved_bytes;
  blocks.clear();
  device_release_cached();
  EXPECT_LT(device_memory_stats().reserved_bytes, held);  // the segments, every block back in a bin, are freed
  // And what was released can be had again.
  const Tensor again = Tensor::zeros({(700 << 10) / 4}, DType::F32, Device::CUDA);
  EXPECT_EQ(again.to_floats().back(), 0.f);
}

}  // namespace
}  // namespace lathe
