// A prefill's attention on the CPU takes its query rows in blocks that share each K/V row's loads
// (tensor/cpu/attention_avx512.cc). A query row's output must not depend on the block it lands in: for every
// row it is bitwise what the row gets alone (one query row, the decode path), on each instruction set, for f32
// and bf16 K/V, GQA groups of one and two heads, causal and non-causal masks, windows, explicit (ring)
// positions, softcap, and prompts that start after cached keys.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "support/cpu_kernel_cases.h"
#include "support/test_util.h"
#include "tensor/cpu/cpu_features.h"
#include "tensor/ops.h"

namespace lathe {
namespace {

class CpuAttentionPrefill : public ::testing::TestWithParam<int64_t> {};  // head size

TEST_P(CpuAttentionPrefill, EachQueryRowIsBitwiseItsOneRowResult) {
  const int64_t D = GetParam();
  const int64_t T = 21, S = 75;  // 21 rows: two full query blocks and a partial one; 54 keys cached before them
  for (const cpu::Isa isa : {cpu::Isa::Avx2, cpu::Isa::Avx512Vnni}) {
    if (!cpu::isa_supported(isa)) continue;
    const testutil::IsaScope scope(isa);
    SCOPED_TRACE(isa == cpu::Isa::Avx2 ? "avx2" : "avx512");
    std::vector<int64_t> ring(static_cast<size_t>(S));
    for (int64_t j = 0; j < S; ++j) ring[static_cast<size_t>(j)] = (j * 7) % S;
    for (const int64_t Hkv : {int64_t{2}, int64_t{4}}) {  // group of two query heads per KV head, then one
      const int64_t Hq = 4;
      const Tensor q = testutil::random_tensor({T, Hq, D}, 31);
      for (const DType kv_type : {DType::F32, DType::BF16}) {
        const Tensor k = testutil::random_tensor({S, Hkv, D}, 32).to(kv_type);
        const Tensor v = testutil::random_tensor({S, Hkv, D}, 33).to(kv_type);
        AttentionParams base;
        base.scale = 0.3f;
        base.q_pos0 = S - T;
        for (const auto& [variant, p] : testutil::attention_cases(base, 9, &ring, 0.8f, /*non_causal=*/true)) {
          const Tensor all = attention(q, k, v, p);
          for (int64_t t = 0; t < T; ++t) {
            AttentionParams one = p;
            one.q_pos0 = p.q_pos0 + t;
            const Tensor alone = attention(q.slice(0, t, t + 1).contiguous(), k, v, one);
            const Tensor mine = all.slice(0, t, t + 1).contiguous();
            ASSERT_EQ(std::memcmp(alone.raw(), mine.raw(), alone.nbytes()), 0)
                << "row " << t << " variant " << variant << " kv heads " << Hkv << " kv "
                << (kv_type == DType::BF16 ? "bf16" : "f32");
          }
        }
      }
    }
  }
}

// Rows that see no key at all (a window past every cached key) get zeros, as alone.
TEST_P(CpuAttentionPrefill, RowsThatSeeNoKeyGetZeros) {
  const int64_t D = GetParam(), T = 10, S = 12, Hq = 2, Hkv = 1;
  const Tensor q = testutil::random_tensor({T, Hq, D}, 41);
  const Tensor k = testutil::random_tensor({S, Hkv, D}, 42), v = testutil::random_tensor({S, Hkv, D}, 43);
  std::vector<int64_t> far(static_cast<size_t>(S), 1000);  // every key after every query
  AttentionParams p;
  p.k_pos = &far;
  const Tensor out = attention(q, k, v, p);
  for (int64_t i = 0; i < out.numel(); ++i) ASSERT_EQ(out.data<float>()[i], 0.f) << i;
}

INSTANTIATE_TEST_SUITE_P(HeadSizes, CpuAttentionPrefill,
                         ::testing::Values(int64_t{32}, int64_t{64}, int64_t{128}, int64_t{256}));

}  // namespace
}  // namespace lathe
