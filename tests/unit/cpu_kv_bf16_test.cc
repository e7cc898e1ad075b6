// A CPU cache with cpu_kv_bf16 keeps K/V rows as bf16 (half the bytes decode attention reads): the rows are the
// f32 rows rounded to bf16, attention over them is bitwise attention over the same values widened to f32
// (for head sizes in whole 16-lane steps; to rounding otherwise),
// and a state of either type restores into either cache (KV files written before the option, or by --exact).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "cache/layer_cache.h"
#include "support/test_util.h"
#include "tensor/ops.h"

namespace lathe {
namespace {

bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor x = a.contiguous(), y = b.contiguous();
  return x.dtype() == y.dtype() && x.shape() == y.shape() && std::memcmp(x.raw(), y.raw(), x.nbytes()) == 0;
}

Tensor widened(const Tensor& x) { return x.contiguous().to(DType::BF16).to(DType::F32); }

class CpuKvBf16 : public ::testing::TestWithParam<int64_t> {};  // head size

TEST_P(CpuKvBf16, RowsAreRoundedAndAttentionIsTheWidenedF32s) {
  const int64_t D = GetParam(), Hkv = 2, Hq = 4;
  CacheOptions bf16;
  bf16.cpu_kv_bf16 = true;
  for (const int64_t window : {int64_t{0}, int64_t{6}}) {
    auto cache = make_attention_cache(window, bf16);
    const Tensor k = testutil::random_tensor({9, Hkv, D}, 1), v = testutil::random_tensor({9, Hkv, D}, 2);
    KVView view = cache->update(k, v);  // prefill
    ASSERT_EQ(view.k.dtype(), DType::BF16);
    if (window == 0) {
      EXPECT_TRUE(same_bits(view.k.to(DType::F32), widened(k)));
      EXPECT_TRUE(same_bits(view.v.to(DType::F32), widened(v)));
    }
    const Tensor k1 = testutil::random_tensor({1, Hkv, D}, 3), v1 = testutil::random_tensor({1, Hkv, D}, 4);
    view = cache->update(k1, v1);  // decode (a ring in place, with explicit positions, when windowed)
    AttentionParams p;
    p.scale = 0.125f;
    p.q_pos0 = 9;
    p.k_pos0 = view.pos0;
    p.k_pos = view.positions.empty() ? nullptr : &view.positions;
    p.window = window;
    const Tensor q = testutil::random_tensor({1, Hq, D}, 5);
    const Tensor got = attention(q, view.k, view.v, p);
    const Tensor want = attention(q, view.k.to(DType::F32), view.v.to(DType::F32), p);
    if (D % 16 == 0) {
      EXPECT_TRUE(same_bits(got, want)) << "window " << window;
    } else {  // scalar tails: the compiler may contract differently; still the same values to rounding
      for (int64_t i = 0; i < got.numel(); ++i)
        EXPECT_NEAR(got.data<float>()[i], want.data<float>()[i], 1e-5f) << "window " << window;
    }
  }
}

TEST_P(CpuKvBf16, StatesOfEitherTypeRestore) {
  const int64_t D = GetParam();
  CacheOptions f32, bf16;
  bf16.cpu_kv_bf16 = true;
  const Tensor k = testutil::random_tensor({5, 2, D}, 6), v = testutil::random_tensor({5, 2, D}, 7);
  for (const int64_t window : {int64_t{0}, int64_t{8}}) {
    auto a = make_attention_cache(window, f32);
    a->update(k, v);
    auto b = make_attention_cache(window, bf16);
    b->restore(a->state());  // an f32 file into a bf16 cache: rounded
    const CacheState sb = b->state();
    ASSERT_EQ(sb.tensors.size(), 2u);
    EXPECT_TRUE(same_bits(sb.tensors[0].second.to(DType::F32), widened(k)));
    auto c = make_attention_cache(window, f32);
    c->restore(sb);  // and back: widened exactly
    EXPECT_EQ(c->state().tensors[0].second.dtype(), DType::F32);
    EXPECT_TRUE(same_bits(c->state().tensors[0].second, widened(k)));
  }
}

INSTANTIATE_TEST_SUITE_P(HeadSizes, CpuKvBf16, ::testing::Values(int64_t{64}, int64_t{128}, int64_t{96}, int64_t{20}));

}  // namespace
}  // namespace lathe
