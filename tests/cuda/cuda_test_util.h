// Shared helpers for the CUDA tests: a skip when no GPU is present (so the binary passes cleanly on CI
// machines) and random inputs. Fixture locations come from support/fixtures.h.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "tensor/device_memory.h"
#include "tensor/ops.h"
#include "tensor/ops_extra.h"
#include "tensor/tensor.h"

namespace lathe::testing_cuda {

#define LATHE_REQUIRE_GPU()                                                           \
  do {                                                                                \
    if (!::lathe::cuda_available()) GTEST_SKIP() << "no CUDA device on this machine"; \
  } while (0)

inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

inline float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0.f;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

inline float max_abs(const std::vector<float>& a) {
  float m = 0.f;
  for (float x : a) m = std::max(m, std::abs(x));
  return m;
}

// RoPE over the first `dims` features of a head (all of them when dims is the head size), base 10000.
inline RopeTable test_rope(int64_t dims) {
  RopeTable rope;
  rope.dims = static_cast<int>(dims);
  for (int64_t i = 0; i < dims / 2; ++i)
    rope.inv_freq.push_back(std::pow(10000.f, -static_cast<float>(2 * i) / static_cast<float>(dims)));
  return rope;
}

// The append's head layout, with (norm) or without q/k RMS norms, their weights random from seed and seed + 1.
inline QkvStep test_qkv_step(int64_t Hq, int64_t Hkv, int64_t D, bool norm, uint32_t seed, Device d = Device::CUDA) {
  return QkvStep{Hq,
                 Hkv,
                 D,
                 norm,
                 Tensor::from_floats(random_floats(static_cast<size_t>(D), seed), {D}).to(d),
                 Tensor::from_floats(random_floats(static_cast<size_t>(D), seed + 1), {D}).to(d)};
}

}  // namespace lathe::testing_cuda
