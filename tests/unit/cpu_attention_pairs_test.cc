// GQA attention on the CPU runs two query heads per task when a KV head serves an even number of them, sharing
// each key row's loads (tensor/cpu/attention.cc, attention_avx512.cc). On each instruction set, each head's
// output must be bitwise what the one-head path gives it, for f32 and bf16 K/V, linear and explicit (ring)
// positions, windows and softcap; the AVX-512 and AVX2 kernels agree to rounding.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "support/cpu_kernel_cases.h"
#include "support/test_util.h"
#include "tensor/cpu/cpu_features.h"
#include "tensor/ops.h"

namespace lathe {
namespace {

class CpuAttentionPairs : public ::testing::TestWithParam<int64_t> {};  // head size

void check_pairs_against_single_heads(int64_t D);

TEST_P(CpuAttentionPairs, EachHeadIsBitwiseItsOneHeadResult) {
  for (const cpu::Isa isa : {cpu::Isa::Avx2, cpu::Isa::Avx512Vnni}) {
    if (!cpu::isa_supported(isa)) continue;
    const testutil::IsaScope scope(isa);
    SCOPED_TRACE(isa == cpu::Isa::Avx2 ? "avx2" : "avx512");
    check_pairs_against_single_heads(GetParam());
  }
}

TEST_P(CpuAttentionPairs, Avx512AgreesWithAvx2) {
  if (!cpu::isa_supported(cpu::Isa::Avx512Vnni)) GTEST_SKIP() << "no AVX-512 on this CPU";
  const int64_t D = GetParam(), T = 2, Hq = 6, Hkv = 3, S = 41;  // odd GQA group: one head per task
  const Tensor q = testutil::random_tensor({T, Hq, D}, 21);
  for (const int64_t hkv : {Hkv, Hq}) {
    const Tensor k = testutil::random_tensor({S, hkv, D}, 22).to(DType::BF16),
                 v = testutil::random_tensor({S, hkv, D}, 23);
    AttentionParams p;
    p.scale = 0.2f;
    p.q_pos0 = S - T;
    Tensor wide, narrow;
    {
      const testutil::IsaScope scope(cpu::Isa::Avx512Vnni);
      wide = attention(q, k, v.to(DType::BF16), p);
    }
    {
      const testutil::IsaScope scope(cpu::Isa::Avx2);
      narrow = attention(q, k, v.to(DType::BF16), p);
    }
    for (int64_t i = 0; i < wide.numel(); ++i) EXPECT_NEAR(wide.data<float>()[i], narrow.data<float>()[i], 1e-5f);
  }
}

void check_pairs_against_single_heads(int64_t D) {
  const int64_t T = 3, Hq = 4, Hkv = 2, S = 29;
  const Tensor q = testutil::random_tensor({T, Hq, D}, 11);
  std::vector<int64_t> ring(static_cast<size_t>(S));
  for (int64_t j = 0; j < S; ++j) ring[static_cast<size_t>(j)] = (j * 5) % S;
  for (const DType kv_type : {DType::F32, DType::BF16}) {
    const Tensor k = testutil::random_tensor({S, Hkv, D}, 12).to(kv_type),
                 v = testutil::random_tensor({S, Hkv, D}, 13).to(kv_type);
    AttentionParams base;
    base.scale = 0.2f;
    base.q_pos0 = S - T;
    for (const auto& [variant, p] : testutil::attention_cases(base, 7, &ring, 0.7f)) {
      const Tensor both = attention(q, k, v, p);  // [T, Hq, D]: the paired path
      for (int64_t h = 0; h < Hq; ++h) {
        // Head h alone against its KV head: one query head per KV head, the one-head path.
        const Tensor qh = q.slice(1, h, h + 1).contiguous();
        const Tensor kh = k.slice(1, h / 2, h / 2 + 1).contiguous(), vh = v.slice(1, h / 2, h / 2 + 1).contiguous();
        const Tensor alone = attention(qh, kh, vh, p);
        const Tensor mine = both.slice(1, h, h + 1).contiguous();
        EXPECT_EQ(std::memcmp(alone.raw(), mine.raw(), alone.nbytes()), 0)
            << "head " << h << " variant " << variant << " kv " << (kv_type == DType::BF16 ? "bf16" : "f32");
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(HeadSizes, CpuAttentionPairs,
                         ::testing::Values(int64_t{32}, int64_t{64}, int64_t{128}, int64_t{256}));

}  // namespace
}  // namespace lathe
