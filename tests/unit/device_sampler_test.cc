// The device sampler's contract on the host: logits on the CPU, mismatched row counts and rows it does not cover
// make it decline with the output untouched, so the caller samples the step on the host (the CUDA half is in
// tests/cuda/batched_test.cc).
#include <gtest/gtest.h>

#include "engine/device_sampler.h"

namespace lathe {
namespace {

TEST(DeviceSampler, DeclinesHostLogitsAndUncoveredRows) {
  const Tensor logits = Tensor::from_floats({0.1f, 0.9f, 0.3f, 0.7f, 0.2f, 0.1f}, {2, 3});
  SamplingParams greedy;
  std::vector<DeviceSampleRow> rows(2);
  for (auto& r : rows) r.params = &greedy;
  std::vector<SampleResult> out;
  EXPECT_FALSE(sample_on_device(logits, rows, out));
  EXPECT_TRUE(out.empty());
  EXPECT_FALSE(sample_on_device(Tensor(), rows, out));
  EXPECT_FALSE(sample_on_device(logits, std::span<const DeviceSampleRow>(rows.data(), 1), out));
  EXPECT_TRUE(out.empty());
}

}  // namespace
}  // namespace lathe
