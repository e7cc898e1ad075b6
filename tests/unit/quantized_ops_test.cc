// Quantized matmul and embedding against a plain dequantize-then-multiply reference, for every supported
// bits x group size, one row (fused GEMV path) and several rows (tiled path), including word tails.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "common/error.h"

#include "quant/affine.h"
#include "support/test_util.h"
#include "tensor/ops.h"

namespace lathe {
namespace {

using testutil::random_floats;

// f32 accumulation in a different order than the double reference: a bound relative to Σ|x·w|.
double tolerance(const float* x, const float* w, int64_t K) {
  double mag = 0;
  for (int64_t k = 0; k < K; ++k) mag += std::abs(static_cast<double>(x[k]) * w[k]);
  return 2e-6 * mag + 1e-6;
}

struct QuantizedOpsCase {
  int bits, group;
  int64_t K;
};

class QuantizedMatmul : public ::testing::TestWithParam<QuantizedOpsCase> {};

TEST_P(QuantizedMatmul, MatchesDequantizedReference) {
  const auto [bits, group, K] = GetParam();
  const int64_t N = 37;
  const auto w = random_floats(static_cast<size_t>(N * K), 1);
  Weight qw;
  qw.quantized = true;
  qw.q = quant::quantize(w.data(), N, K, bits, group);
  const std::vector<float> deq = dequantize(qw.q).to_floats();
  // Quantization error is bounded by half a step per value.
  for (int64_t i = 0; i < N * K; ++i)
    ASSERT_LT(std::abs(deq[static_cast<size_t>(i)] - w[static_cast<size_t>(i)]), 2.0f);
  for (int64_t M : {int64_t{1}, int64_t{5}}) {
    const auto x = random_floats(static_cast<size_t>(M * K), 2);
    const std::vector<float> y = linear(Tensor::from_floats(x, {M, K}), qw).to_floats();
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double ref = 0;
        for (int64_t k = 0; k < K; ++k)
          ref += static_cast<double>(x[static_cast<size_t>(m * K + k)]) * deq[static_cast<size_t>(n * K + k)];
        ASSERT_NEAR(y[static_cast<size_t>(m * N + n)], ref,
                    tolerance(&x[static_cast<size_t>(m * K)], &deq[static_cast<size_t>(n * K)], K))
            << "bits " << bits << " group " << group << " K " << K << " M " << M << " n " << n;
      }
  }
}

INSTANTIATE_TEST_SUITE_P(AllLayouts, QuantizedMatmul,
                         ::testing::Values(QuantizedOpsCase{2, 32, 256}, QuantizedOpsCase{2, 64, 192},
                                           QuantizedOpsCase{2, 128, 384}, QuantizedOpsCase{4, 32, 96},
                                           QuantizedOpsCase{4, 32, 256}, QuantizedOpsCase{4, 64, 320},
                                           QuantizedOpsCase{4, 128, 512}, QuantizedOpsCase{8, 32, 96},
                                           QuantizedOpsCase{8, 64, 192}, QuantizedOpsCase{8, 128, 256}),
                         [](const auto& info) {
                           char name[64];
                           std::snprintf(name, sizeof name, "b%d_g%d_k%ld", info.param.bits, info.param.group,
                                         static_cast<long>(info.param.K));
                           return std::string(name);
                         });

TEST(Quantize, LargerMagnitudeExtremeIsExact) {
  std::vector<float> w(64);
  for (int i = 0; i < 64; ++i) w[static_cast<size_t>(i)] = -3.0f + 0.05f * static_cast<float>(i);
  const QuantizedMatrix q = quant::quantize(w.data(), 1, 64, 4, 64, DType::F32);
  const auto deq = dequantize(q).to_floats();
  EXPECT_FLOAT_EQ(deq[0], -3.0f);
}

TEST(Quantize, F16ScalesWork) {
  const auto w = random_floats(32 * 128, 3);
  Weight qw;
  qw.quantized = true;
  qw.q = quant::quantize(w.data(), 32, 128, 4, 64, DType::F16);
  const auto x = random_floats(128, 4);
  const auto deq = dequantize(qw.q).to_floats();
  const auto y = linear(Tensor::from_floats(x, {1, 128}), qw).to_floats();
  for (int n = 0; n < 32; ++n) {
    double ref = 0;
    for (int k = 0; k < 128; ++k)
      ref += static_cast<double>(x[static_cast<size_t>(k)]) * deq[static_cast<size_t>(n * 128 + k)];
    EXPECT_NEAR(y[static_cast<size_t>(n)], ref, tolerance(x.data(), &deq[static_cast<size_t>(n * 128)], 128));
  }
}

TEST(Embedding, QuantizedRowsEqualDequantizedTable) {
  const auto w = random_floats(50 * 64, 5);
  Weight table;
  table.quantized = true;
  table.q = quant::quantize(w.data(), 50, 64, 8, 32);
  const auto deq = dequantize(table.q).to_floats();
  const auto rows = embedding({7, 0, 49}, table).to_floats();
  for (int i = 0; i < 64; ++i) {
    EXPECT_EQ(rows[static_cast<size_t>(i)], deq[static_cast<size_t>(7 * 64 + i)]);
    EXPECT_EQ(rows[static_cast<size_t>(128 + i)], deq[static_cast<size_t>(49 * 64 + i)]);
  }
}

TEST(Embedding, OutOfRangeIdIsAnError) {
  Weight table;
  table.dense = Tensor::zeros({10, 4}, DType::BF16);
  EXPECT_THROW(embedding({10}, table), Error);
  EXPECT_THROW(embedding({-1}, table), Error);
}

TEST(DenseLinear, Bf16AndF32WeightsAgreeWithNaive) {
  const int64_t M = 6, K = 72, N = 19;
  const auto x = random_floats(static_cast<size_t>(M * K), 6);
  const auto wf = random_floats(static_cast<size_t>(N * K), 7);
  Weight w32, w16;
  w32.dense = Tensor::from_floats(wf, {N, K});
  w16.dense = w32.dense.to(DType::BF16);
  const auto wb = w16.dense.to_floats();
  const Tensor xt = Tensor::from_floats(x, {M, K});
  const auto y32 = linear(xt, w32).to_floats(), y16 = linear(xt, w16).to_floats();
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double r32 = 0, r16 = 0;
      for (int64_t k = 0; k < K; ++k) {
        r32 += static_cast<double>(x[static_cast<size_t>(m * K + k)]) * wf[static_cast<size_t>(n * K + k)];
        r16 += static_cast<double>(x[static_cast<size_t>(m * K + k)]) * wb[static_cast<size_t>(n * K + k)];
      }
      EXPECT_NEAR(y32[static_cast<size_t>(m * N + n)], r32, 1e-4);
      EXPECT_NEAR(y16[static_cast<size_t>(m * N + n)], r16, 1e-4);
    }
}

// One or two rows against bf16 weights take the in-register GEMV (cpu/matmul.cc); each output must be bitwise what
// the f32-tile path gives the same row inside a larger call (its dequantized twin, f32 weights), odd row included.
TEST(DenseLinear, Bf16DecodeRowsBitwiseTheTilePath) {
  const int64_t K = 96, N = 37;  // N: two 16-row tiles and an odd 5-row one
  const auto x = random_floats(static_cast<size_t>(5 * K), 8);
  Weight w16, w32;
  w16.dense = Tensor::from_floats(random_floats(static_cast<size_t>(N * K), 9), {N, K}).to(DType::BF16);
  w32.dense = Tensor::from_floats(w16.dense.to_floats(), {N, K});
  const auto all = linear(Tensor::from_floats(x, {5, K}), w16).to_floats();
  const auto all32 = linear(Tensor::from_floats(x, {5, K}), w32).to_floats();
  for (int64_t M : {1, 2}) {
    const std::vector<float> xs(x.begin(), x.begin() + M * K);
    const auto few = linear(Tensor::from_floats(xs, {M, K}), w16).to_floats();
    for (int64_t i = 0; i < M * N; ++i) {
      EXPECT_EQ(few[static_cast<size_t>(i)], all[static_cast<size_t>(i)]) << "M " << M << " i " << i;
      EXPECT_EQ(few[static_cast<size_t>(i)], all32[static_cast<size_t>(i)]) << "M " << M << " i " << i;
    }
  }
}

}  // namespace
}  // namespace lathe
