// The CPU integer-dot matmul (int8 activations over weights packed at load — 2 to 6 and 8-bit checkpoints — or
// 16-bit activations run as two int8 rows): a row of an M-row call is bitwise the same row computed alone (batched
// greedy equals solo greedy) for every tile shape, it stays close to the exact f32 kernel (16-bit activations ~250×
// closer), every kernel this CPU can run (scalar, AVX2, AVX-VNNI, AVX-512 VNNI) gives bitwise the same outputs, row
// slices share their parent's packing, and layouts the kernels do not cover stay on the exact path.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "quant/affine.h"
#include "support/cpu_kernel_cases.h"
#include "support/test_util.h"
#include "tensor/cpu/cpu_features.h"
#include "tensor/cpu/packed_quant.h"
#include "tensor/ops.h"

namespace lathe {
namespace {

using testutil::random_floats;

struct CpuInt8MatmulCase {
  int bits, group;
  int64_t K;
  DType scales = DType::BF16;  // BF16: scales and biases packed after each row's codes; F32: separate arrays
  int act_bits = 8;            // 16: activations split into two int8 rows (packed_quant.h)
};

using testutil::IsaScope;

class Int8Matmul : public ::testing::TestWithParam<CpuInt8MatmulCase> {
 protected:
  void SetUp() override {
    const auto [bits, group, K, scales, act_bits] = GetParam();
    const auto w = random_floats(static_cast<size_t>(kN * K), 1);
    exact_.quantized = true;
    exact_.q = quant::quantize(w.data(), kN, K, bits, group, scales);
    packed_ = exact_;
    pack_for_cpu(packed_.q, act_bits);
    ASSERT_NE(packed_.q.cpu_packed, nullptr);
    dense_.dense = dequantize(exact_.q);  // the reference: the dequantized weights (any bit width) in f32
  }
  static constexpr int64_t kN = 37;  // tails of every tile shape
  Weight exact_, packed_, dense_;
};

constexpr cpu::Isa kAllIsas[] = {cpu::Isa::Scalar, cpu::Isa::Avx2, cpu::Isa::AvxVnni, cpu::Isa::Avx512Vnni,
                                 cpu::Isa::NeonDot};

std::vector<cpu::Isa> isas() {  // those this CPU runs
  std::vector<cpu::Isa> v;
  for (cpu::Isa isa : kAllIsas)
    if (cpu::isa_supported(isa)) v.push_back(isa);
  return v;
}

TEST_P(Int8Matmul, EachRowIsBitwiseItsSoloResult) {
  const int64_t K = GetParam().K;
  for (cpu::Isa isa : isas()) {
    IsaScope scope(isa);
    // Every tile shape: 4-row tiles, and 1-, 2- and 3-row remainders after them; from 16 rows, prefill tiles of
    // two 16-row blocks (37 weight rows: a pair of blocks and a partial one).
    for (int64_t M : {2, 3, 4, 5, 6, 7, 8, 9, 16, 21}) {
      auto x = random_floats(static_cast<size_t>(M * K), 2 + static_cast<uint32_t>(M));
      x[3] = 40.f;  // an outlier in one row's group must not change any other row
      const std::vector<float> batched = linear(Tensor::from_floats(x, {M, K}), packed_).to_floats();
      for (int64_t m = 0; m < M; ++m) {
        const std::vector<float> row(x.begin() + m * K, x.begin() + (m + 1) * K);
        const std::vector<float> solo = linear(Tensor::from_floats(row, {1, K}), packed_).to_floats();
        ASSERT_EQ(std::memcmp(solo.data(), batched.data() + m * kN, sizeof(float) * kN), 0)
            << cpu::isa_name(isa) << " M " << M << " row " << m;
      }
    }
  }
}

TEST_P(Int8Matmul, CloseToTheExactKernel) {
  const int64_t K = GetParam().K, M = 3;
  const auto x = random_floats(static_cast<size_t>(M * K), 7);
  const Tensor xt = Tensor::from_floats(x, {M, K});
  const std::vector<float> ref = linear(xt, dense_).to_floats();
  for (cpu::Isa isa : isas()) {
    IsaScope scope(isa);
    const std::vector<float> y = linear(xt, packed_).to_floats();
    double err = 0, mag = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      err += (y[i] - ref[i]) * static_cast<double>(y[i] - ref[i]);
      mag += ref[i] * static_cast<double>(ref[i]);
    }
    // int8 activations per group on Gaussian inputs: ~0.5% relative rms error; 1% bounds it. 16-bit ones
    // (±32512 levels, 256× finer) measure ~2e-5.
    EXPECT_LT(std::sqrt(err / mag), GetParam().act_bits == 16 ? 1e-4 : 1e-2) << cpu::isa_name(isa);
  }
}

TEST_P(Int8Matmul, EveryIsaGivesBitwiseTheScalarResult) {
  const int64_t K = GetParam().K;
  for (int64_t M : {int64_t{1}, int64_t{4}, int64_t{7}, int64_t{18}}) {
    const Tensor x =
        Tensor::from_floats(random_floats(static_cast<size_t>(M * K), 9 + static_cast<uint32_t>(M)), {M, K});
    std::vector<float> ref;
    {
      IsaScope s(cpu::Isa::Scalar);
      ref = linear(x, packed_).to_floats();
    }
    // Same int8 activations, the same exact integer halves per group and the same float steps.
    for (cpu::Isa isa : isas()) {
      IsaScope s(isa);
      ASSERT_EQ(cpu::active_isa(), isa);
      const std::vector<float> y = linear(x, packed_).to_floats();
      ASSERT_EQ(std::memcmp(y.data(), ref.data(), sizeof(float) * ref.size()), 0) << cpu::isa_name(isa) << " M " << M;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, Int8Matmul,
    // Group counts 8, 14 (a partial quad and octet), 5 and 3.
    ::testing::Values(CpuInt8MatmulCase{4, 32, 256}, CpuInt8MatmulCase{4, 32, 448}, CpuInt8MatmulCase{4, 64, 320},
                      CpuInt8MatmulCase{4, 128, 384}, CpuInt8MatmulCase{8, 32, 256}, CpuInt8MatmulCase{8, 32, 448},
                      CpuInt8MatmulCase{8, 64, 320}, CpuInt8MatmulCase{8, 128, 384},
                      CpuInt8MatmulCase{4, 64, 320, DType::F32}, CpuInt8MatmulCase{8, 32, 448, DType::F32},
                      CpuInt8MatmulCase{4, 64, 320, DType::BF16, 16}, CpuInt8MatmulCase{8, 32, 448, DType::BF16, 16},
                      CpuInt8MatmulCase{4, 128, 384, DType::F32, 16},
                      // 2 and 3-bit codes in the 4-bit layout, 5 and 6-bit ones in the 8-bit layout.
                      CpuInt8MatmulCase{2, 64, 320}, CpuInt8MatmulCase{3, 32, 448},
                      CpuInt8MatmulCase{3, 64, 320, DType::F32}, CpuInt8MatmulCase{5, 32, 256},
                      CpuInt8MatmulCase{6, 64, 320}, CpuInt8MatmulCase{6, 128, 384, DType::BF16, 16}),
    [](const auto& info) {
      return std::to_string(info.param.bits) + "bit_g" + std::to_string(info.param.group) + "_k" +
             std::to_string(info.param.K) + (info.param.scales == DType::F32 ? "_f32" : "") +
             (info.param.act_bits == 16 ? "_act16" : "");
    });

TEST(Int8MatmulPacking, LongPrefillBlocksKeepRowsBitwiseSolo) {
  // K = 8192 makes the kernel take the activation rows in blocks of 16: 37 rows cross two block edges.
  const int64_t N = 13, K = 8192, M = 37;
  const auto w = random_floats(static_cast<size_t>(N * K), 11);
  Weight q{Tensor(), quant::quantize(w.data(), N, K, 4, 64), true};
  pack_for_cpu(q.q);
  const auto x = random_floats(static_cast<size_t>(M * K), 12);
  for (cpu::Isa isa : isas()) {
    IsaScope scope(isa);
    const std::vector<float> batched = linear(Tensor::from_floats(x, {M, K}), q).to_floats();
    for (int64_t m = 0; m < M; ++m) {
      const std::vector<float> row(x.begin() + m * K, x.begin() + (m + 1) * K);
      const std::vector<float> solo = linear(Tensor::from_floats(row, {1, K}), q).to_floats();
      ASSERT_EQ(std::memcmp(solo.data(), batched.data() + m * N, sizeof(float) * N), 0)
          << cpu::isa_name(isa) << " " << m;
    }
  }
}

TEST(CpuIsa, ForcedLevelsClampToTheCpu) {
  const cpu::Isa saved = cpu::active_isa();
  for (cpu::Isa isa : kAllIsas) {
    cpu::set_isa_for_testing(isa);
    EXPECT_TRUE(cpu::isa_supported(cpu::active_isa())) << cpu::isa_name(isa);
    EXPECT_LE(static_cast<int>(cpu::active_isa()), static_cast<int>(isa));
    if (cpu::isa_supported(isa)) {
      EXPECT_EQ(cpu::active_isa(), isa);
    }
  }
  cpu::set_isa_for_testing(saved);
}

TEST(Int8MatmulPacking, RowSliceSharesTheParentPacking) {
  const int64_t N = 24, K = 128;
  const auto w = random_floats(static_cast<size_t>(N * K), 3);
  QuantizedMatrix q = quant::quantize(w.data(), N, K, 4, 64);
  pack_for_cpu(q);
  Weight whole{Tensor(), q, true}, part{Tensor(), q, true};
  part.q.w = q.w.slice(0, 8, 20);
  part.q.scales = q.scales.slice(0, 8, 20);
  part.q.biases = q.biases.slice(0, 8, 20);
  part.q.cpu_packed_row0 = 8;
  const Tensor x = Tensor::from_floats(random_floats(static_cast<size_t>(2 * K), 4), {2, K});
  const auto full = linear(x, whole).to_floats(), sliced = linear(x, part).to_floats();
  for (int64_t m = 0; m < 2; ++m)
    for (int64_t n = 0; n < 12; ++n)
      ASSERT_EQ(full[static_cast<size_t>(m * N + 8 + n)], sliced[static_cast<size_t>(m * 12 + n)]);
}

TEST(Int8MatmulPacking, SharedInputOutputsAreBitwiseTheirOwnCalls) {
  // linear_many (q|k|v, gate|up over one quantized x): row slices of one packing, weights of other bit widths and
  // scale types, one that cannot share (another group size) and a dense one; 16-bit activations too; every ISA.
  const int64_t K = 256;
  auto packed = [&](int64_t n, int bits, int group, DType scales, int act_bits, uint32_t seed) {
    const auto w = random_floats(static_cast<size_t>(n * K), seed);
    Weight q{Tensor(), quant::quantize(w.data(), n, K, bits, group, scales), true};
    pack_for_cpu(q.q, act_bits);
    return q;
  };
  for (int act_bits : {8, 16}) {
    const Weight whole = packed(56, 4, 64, DType::BF16, act_bits, 21);
    Weight slice = whole;
    slice.q.w = whole.q.w.slice(0, 20, 45);
    slice.q.scales = whole.q.scales.slice(0, 20, 45);
    slice.q.biases = whole.q.biases.slice(0, 20, 45);
    slice.q.cpu_packed_row0 = 20;
    const Weight eight = packed(19, 8, 64, DType::F32, act_bits, 22);
    const Weight other_group = packed(9, 4, 32, DType::BF16, act_bits, 23);
    Weight dense;
    dense.dense = Tensor::from_floats(random_floats(static_cast<size_t>(5 * K), 24), {5, K});
    const Tensor bias = Tensor::from_floats(random_floats(19, 25), {19});
    const std::vector<const Weight*> ws{&whole, &slice, &eight, &other_group, &dense};
    const std::vector<const Tensor*> biases{nullptr, nullptr, &bias};
    for (cpu::Isa isa : isas()) {
      IsaScope scope(isa);
      for (int64_t M : {int64_t{1}, int64_t{6}, int64_t{33}}) {
        const Tensor x = Tensor::from_floats(random_floats(static_cast<size_t>(M * K), 26), {M, K});
        const std::vector<Tensor> ys = linear_many(x, ws, biases);
        ASSERT_EQ(ys.size(), ws.size());
        for (size_t i = 0; i < ws.size(); ++i) {
          const std::vector<float> y = ys[i].to_floats(),
                                   ref = linear(x, *ws[i], i < biases.size() ? biases[i] : nullptr).to_floats();
          ASSERT_EQ(y.size(), ref.size());
          ASSERT_EQ(std::memcmp(y.data(), ref.data(), sizeof(float) * ref.size()), 0)
              << cpu::isa_name(isa) << " act_bits " << act_bits << " M " << M << " weight " << i;
        }
      }
    }
  }
}

TEST(Int8MatmulPacking, UncoveredLayoutsStayExact) {
  // Weights off the CPU have no packing; a group size the kernels do not take (16) neither.
  const auto w = random_floats(static_cast<size_t>(8 * 96), 5);
  QuantizedMatrix q = quant::quantize(w.data(), 8, 96, 4, 32);
  q.group_size = 16;
  pack_for_cpu(q);
  EXPECT_EQ(q.cpu_packed, nullptr);
}

TEST(Int8MatmulPacking, ColumnsNeedOnlyWholeGroups) {
  // 96 columns, three groups of 32: covered (the 16-row blocks need whole groups, not whole 64-element units).
  const int64_t N = 8, K = 96;
  const auto w = random_floats(static_cast<size_t>(N * K), 5);
  Weight exact{Tensor(), quant::quantize(w.data(), N, K, 4, 32), true};
  Weight packed = exact;
  pack_for_cpu(packed.q);
  ASSERT_NE(packed.q.cpu_packed, nullptr);
  const Tensor x = Tensor::from_floats(random_floats(static_cast<size_t>(2 * K), 6), {2, K});
  const auto ref = linear(x, exact).to_floats(), y = linear(x, packed).to_floats();
  double err = 0, mag = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    err += (y[i] - ref[i]) * static_cast<double>(y[i] - ref[i]);
    mag += ref[i] * static_cast<double>(ref[i]);
  }
  EXPECT_LT(std::sqrt(err / mag), 1e-2);  // as CloseToTheExactKernel
}

}  // namespace
}  // namespace lathe
