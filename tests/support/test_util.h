// Small helpers several test suites share: seeded random data and a reference log-softmax.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "tensor/tensor.h"

namespace lathe::testutil {

// n values from N(0, scale²), reproducible from the seed.
inline std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// A contiguous F32 tensor of random_floats.
inline Tensor random_tensor(const Shape& shape, uint32_t seed) {
  Tensor t = Tensor::empty(shape, DType::F32);
  const auto v = random_floats(static_cast<size_t>(t.numel()), seed);
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

// log softmax of x[0, n) in double precision (the reference side of KL and agreement checks).
inline std::vector<double> log_softmax(const float* x, int64_t n) {
  double mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, static_cast<double>(x[i]));
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(x[i] - mx);
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = x[i] - mx - std::log(sum);
  return out;
}

}  // namespace lathe::testutil
