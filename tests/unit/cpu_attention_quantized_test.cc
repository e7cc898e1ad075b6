// The CPU attention over a quantized KV cache reads the codes in place (tensor/cpu/attention_quantized.cc on
// AVX2, attention_avx512.cc's kernel on AVX-512): it must agree with attention over the same cache dequantized
// to f32, for 4- and 8-bit codes, the head sizes the vector kernels cover, GQA, causal and windowed masks,
// explicit key positions and softcap.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "support/cpu_kernel_cases.h"
#include "support/test_util.h"
#include "tensor/cpu/cpu_features.h"
#include "tensor/ops.h"
#include "tensor/ops_extra.h"

namespace lathe {
namespace {

struct QkvAttnCase {
  int bits, group;
  int64_t D;
};

class QuantizedKvAttention : public ::testing::TestWithParam<QkvAttnCase> {};

Tensor random_kv_rows(const Shape& shape, uint64_t seed) {
  Tensor t = Tensor::empty(shape, DType::F32);
  const auto v = testutil::random_floats(static_cast<size_t>(t.numel()), seed);
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

// Largest |a - b| relative to the largest |b|.
float max_rel_diff_to(const Tensor& a, const Tensor& b) {
  float diff = 0.f, mag = 0.f;
  for (int64_t i = 0; i < a.numel(); ++i) {
    diff = std::max(diff, std::fabs(a.data<float>()[i] - b.data<float>()[i]));
    mag = std::max(mag, std::fabs(b.data<float>()[i]));
  }
  return diff / mag;
}

TEST_P(QuantizedKvAttention, MatchesTheDequantizedCache) {
  const auto [bits, group, D] = GetParam();
  const int64_t T = 3, Hq = 4, Hkv = 2, S = 37;
  const Tensor q = random_kv_rows({T, Hq, D}, 1);
  const QuantizedMatrix k = quantize_kv(random_kv_rows({S * Hkv, D}, 2), bits, group);
  const QuantizedMatrix v = quantize_kv(random_kv_rows({S * Hkv, D}, 3), bits, group);
  const Tensor kf = dequantize(k).reshape({S, Hkv, D}), vf = dequantize(v).reshape({S, Hkv, D});
  std::vector<int64_t> positions(static_cast<size_t>(S));
  for (int64_t j = 0; j < S; ++j) positions[static_cast<size_t>(j)] = (j * 7) % S;  // a wrapped ring's order
  AttentionParams base;
  base.scale = 1.0f / std::sqrt(static_cast<float>(D));
  base.q_pos0 = S - T;
  for (const cpu::Isa isa : {cpu::Isa::Avx2, cpu::Isa::Avx512Vnni}) {  // each kernel the machine can run
    if (!cpu::isa_supported(isa)) continue;
    const testutil::IsaScope scope(isa);
    SCOPED_TRACE(isa == cpu::Isa::Avx2 ? "avx2" : "avx512");
    for (const auto& [variant, p] : testutil::attention_cases(base, 9, &positions, 0.5f)) {
      const Tensor fused = attention_quantized(q, k, v, Hkv, p);
      const Tensor reference = attention(q, kf, vf, p);
      EXPECT_LT(max_rel_diff_to(fused, reference), 2e-5f) << "variant " << variant;
    }
  }
}

// A prefill chunk dequantizes each key block once per query block into a tile (attention_avx512.cc): each query
// row's output must still be bitwise what the row gets alone (the decode path, codes read per key), across
// query blocks, rows that start after cached keys, windows, ring positions and softcap.
TEST_P(QuantizedKvAttention, PrefillRowsEqualTheirOneRowResultBitwise) {
  const auto [bits, group, D] = GetParam();
  const int64_t T = 37, Hq = 4, Hkv = 2, S = 90;  // three query blocks (the last partial), 53 keys cached before
  const Tensor q = random_kv_rows({T, Hq, D}, 11);
  const QuantizedMatrix k = quantize_kv(random_kv_rows({S * Hkv, D}, 12), bits, group);
  const QuantizedMatrix v = quantize_kv(random_kv_rows({S * Hkv, D}, 13), bits, group);
  std::vector<int64_t> positions(static_cast<size_t>(S));
  for (int64_t j = 0; j < S; ++j) positions[static_cast<size_t>(j)] = (j * 7) % S;
  AttentionParams base;
  base.scale = 1.0f / std::sqrt(static_cast<float>(D));
  base.q_pos0 = S - T;
  for (const auto& [variant, p] : testutil::attention_cases(base, 9, &positions, 0.5f)) {
    const Tensor all = attention_quantized(q, k, v, Hkv, p);
    for (int64_t t = 0; t < T; ++t) {
      AttentionParams one = p;
      one.q_pos0 = p.q_pos0 + t;
      const Tensor alone = attention_quantized(q.slice(0, t, t + 1).contiguous(), k, v, Hkv, one);
      const std::vector<float> mine = all.slice(0, t, t + 1).to_floats();
      if (cpu::active_isa() == cpu::Isa::Avx512Vnni)
        ASSERT_EQ(alone.to_floats(), mine) << "row " << t << " variant " << variant;
      else  // AVX2: prefill chunks share one dequantized f32 copy, rows read the codes (another summation order)
        ASSERT_LT(max_rel_diff_to(alone, all.slice(0, t, t + 1).contiguous()), 2e-5f) << "row " << t;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Heads, QuantizedKvAttention,
                         ::testing::Values(QkvAttnCase{8, 64, 128}, QkvAttnCase{8, 32, 64}, QkvAttnCase{4, 64, 128},
                                           QkvAttnCase{4, 32, 256}, QkvAttnCase{8, 64, 256}, QkvAttnCase{8, 32, 96}),
                         [](const auto& info) {
                           return std::to_string(info.param.bits) + "bit_g" + std::to_string(info.param.group) + "_d" +
                                  std::to_string(info.param.D);
                         });

}  // namespace
}  // namespace lathe
