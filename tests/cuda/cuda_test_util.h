// Shared helpers for the CUDA tests: a skip when no GPU is present (so the binary passes cleanly on CI
// machines) and random inputs. Fixture locations come from support/fixtures.h.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "tensor/device_memory.h"
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

}  // namespace lathe::testing_cuda
