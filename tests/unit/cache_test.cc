// KVCache and RotatingKVCache: what attention sees, exact snapshot/restore, trim rules.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <random>

#include "cache/layer_cache.h"
#include "common/error.h"
#include "model/model.h"
#include "support/fixtures.h"
#include "tensor/device_memory.h"
#include "tensor/ops.h"
#include "tensor/ops_extra.h"

namespace lathe {
namespace {

Tensor token_rows(int64_t T, int64_t start, int64_t H = 2, int64_t D = 4) {
  std::vector<float> v(static_cast<size_t>(T * H * D));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < H * D; ++i)
      v[static_cast<size_t>(t * H * D + i)] = static_cast<float>(start + t) + 0.01f * static_cast<float>(i);
  return Tensor::from_floats(v, {T, H, D});
}

// Position of each key as seen through the view (token value encodes its position).
std::vector<int64_t> view_positions(const KVView& view) {
  std::vector<int64_t> pos;
  for (int64_t j = 0; j < view.k.dim(0); ++j) {
    const int64_t p = view.positions.empty() ? view.pos0 + j : view.positions[static_cast<size_t>(j)];
    EXPECT_FLOAT_EQ(view.k.select(0, j).to_floats()[0], static_cast<float>(p))
        << "key " << j << " is not at its position";
    pos.push_back(p);
  }
  return pos;
}

TEST(KVCache, GrowsAndReturnsAllTokens) {
  KVCache c;
  c.update(token_rows(300, 0), token_rows(300, 0));
  const KVView v = c.update(token_rows(1, 300), token_rows(1, 300));
  EXPECT_EQ(c.offset(), 301);
  EXPECT_EQ(v.k.dim(0), 301);
  view_positions(v);
  EXPECT_TRUE(c.can_trim(301));
  EXPECT_EQ(c.trim(5), 5);
  EXPECT_EQ(c.offset(), 296);
  const KVView after = c.update(token_rows(1, 296), token_rows(1, 296));
  view_positions(after);
}

// A contiguous cache grows in kKvGrowStep rows, and on a device into every row its allocations hold anyway: never
// into a larger allocation than the rounded step asks for.
TEST(KVCache, GrowthCapacityFillsTheAllocationItTakes) {
  EXPECT_EQ(kv_grow_capacity(257, {2048, 2048}, Device::CPU), 512);
  EXPECT_EQ(kv_grow_capacity(256, {2048}, Device::CPU), 256);
  for (const std::vector<int64_t>& rows : std::vector<std::vector<int64_t>>{{2048}, {2048, 1024}, {1024, 32, 32}}) {
    for (int64_t tokens : {1, 257, 513, 3000}) {
      const int64_t step = (tokens + kKvGrowStep - 1) / kKvGrowStep * kKvGrowStep;
      const int64_t cap = kv_grow_capacity(tokens, rows, Device::CUDA);
      EXPECT_GE(cap, step);
      for (int64_t b : rows)
        EXPECT_EQ(device_alloc_size(static_cast<size_t>(cap * b)), device_alloc_size(static_cast<size_t>(step * b)))
            << tokens << " tokens, rows of " << b << " bytes";
    }
  }
}

TEST(KVCache, DirectRowsMatchUpdate) {
  // A decode step that writes its own row (qkv_rope_append) must leave the cache as update() would.
  KVCache direct, plain;
  KVView want, got;
  for (int64_t t = 0; t < 300; ++t) {  // crosses a capacity step
    const Tensor k = token_rows(1, t), v = token_rows(1, t + 1000);
    want = plain.update(k, v);
    const std::optional<DirectRow> slot = direct.direct_row(k);
    ASSERT_TRUE(slot.has_value());
    ASSERT_EQ(slot->row, t);
    copy_rows(*slot->keys, slot->row, k, 0, 1);
    copy_rows(*slot->values, slot->row, v, 0, 1);
    got = direct.commit_direct();
    ASSERT_EQ(direct.offset(), t + 1);
  }
  EXPECT_EQ(got.k.to_floats(), want.k.to_floats());
  EXPECT_EQ(got.v.to_floats(), want.v.to_floats());
  view_positions(got);
  RotatingKVCache ring(8);
  EXPECT_FALSE(ring.direct_row(token_rows(1, 0)).has_value());  // ring buffers take the update() path
}

// Prefill rows written in place (Attention::prefill_direct): n rows reserved at once, then counted.
TEST(KVCache, DirectRowsReserveAndCountSeveralTokens) {
  KVCache direct, plain;
  KVView want, got;
  int64_t t = 0;
  for (int64_t n : {5, 1, 250, 3}) {  // the third crosses a capacity step
    const Tensor k = token_rows(n, t), v = token_rows(n, t + 1000);
    want = plain.update(k, v);
    const std::optional<DirectRow> slot = direct.direct_rows(k.slice(0, 0, 1), n);
    ASSERT_TRUE(slot.has_value());
    ASSERT_EQ(slot->row, t);
    ASSERT_GE(slot->keys->dim(0), t + n);
    copy_rows(*slot->keys, slot->row, k, 0, n);
    copy_rows(*slot->values, slot->row, v, 0, n);
    got = direct.commit_direct_rows(n);
    t += n;
    ASSERT_EQ(direct.offset(), t);
  }
  EXPECT_EQ(got.k.to_floats(), want.k.to_floats());
  EXPECT_EQ(got.v.to_floats(), want.v.to_floats());
  EXPECT_THROW(direct.commit_direct_rows(1000), Error);  // more than was reserved
  EXPECT_FALSE(direct.direct_rows(token_rows(1, 0), 0).has_value());
  RotatingKVCache ring(8);
  EXPECT_FALSE(ring.direct_rows(token_rows(1, 0), 4).has_value());
  EXPECT_THROW(ring.commit_direct_rows(4), Error);
}

TEST(KVCache, QkvRopeAppendEqualsTheSeparateOps) {
  const int64_t Hq = 4, Hkv = 2, D = 8, cap = 5, row = 3;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  std::vector<float> yv(static_cast<size_t>((Hq + 2 * Hkv) * D)), wq(D), wk(D);
  for (auto& x : yv) x = u(rng);
  for (auto& x : wq) x = u(rng);
  for (auto& x : wk) x = u(rng);
  const Tensor y = Tensor::from_floats(yv, {1, (Hq + 2 * Hkv) * D});
  RopeTable rope;
  rope.dims = 6;  // partial rotation
  for (int i = 0; i < 3; ++i) rope.inv_freq.push_back(std::pow(10000.f, -static_cast<float>(2 * i) / 6.f));
  for (bool norm : {false, true}) {
    const QkvStep st{Hq, Hkv, D, norm, Tensor::from_floats(wq, {D}), Tensor::from_floats(wk, {D}), 1e-6f, true};
    Tensor keys = Tensor::zeros({cap, Hkv, D}, DType::F32), values = Tensor::zeros({cap, Hkv, D}, DType::F32);
    const Tensor q = qkv_rope_append(y, st, rope, 7, keys, values, row);
    Tensor wq_ = y.slice(1, 0, Hq * D).clone().reshape({1, Hq, D});
    Tensor wk_ = y.slice(1, Hq * D, (Hq + Hkv) * D).clone().reshape({1, Hkv, D});
    if (norm) {
      wq_ = rms_norm_rope(wq_, st.q_w, st.eps, true, rope, 7);
      wk_ = rms_norm_rope(wk_, st.k_w, st.eps, true, rope, 7);
    } else {
      rope_inplace(wq_, rope, 7);
      rope_inplace(wk_, rope, 7);
    }
    EXPECT_EQ(q.to_floats(), wq_.to_floats());
    EXPECT_EQ(keys.select(0, row).to_floats(), wk_.reshape({Hkv, D}).to_floats());
    EXPECT_EQ(values.select(0, row).to_floats(),
              y.slice(1, (Hq + Hkv) * D, (Hq + 2 * Hkv) * D).contiguous().reshape({Hkv, D}).to_floats());
    EXPECT_EQ(keys.select(0, row - 1).to_floats(), std::vector<float>(static_cast<size_t>(Hkv * D), 0.f));
  }
  Tensor small = Tensor::zeros({2, Hkv, D}, DType::F32);
  EXPECT_THROW(qkv_rope_append(y, QkvStep{Hq, Hkv, D, false, Tensor(), Tensor()}, rope, 0, small, small, 2),
               Error);  // row past the buffer
}

TEST(RotatingKVCache, KeepsTheWindowAndPositions) {
  RotatingKVCache c(4);
  KVView v = c.update(token_rows(6, 0), token_rows(6, 0));  // prefill longer than the window
  EXPECT_EQ(view_positions(v), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_FALSE(c.can_trim(1));
  for (int64_t t = 6; t < 11; ++t) {
    v = c.update(token_rows(1, t), token_rows(1, t));
    auto pos = view_positions(v);
    std::sort(pos.begin(), pos.end());
    EXPECT_EQ(pos, (std::vector<int64_t>{t - 3, t - 2, t - 1, t}));
  }
  v = c.update(token_rows(3, 11), token_rows(3, 11));  // a second prefill after wrapping
  EXPECT_EQ(view_positions(v), (std::vector<int64_t>{7, 8, 9, 10, 11, 12, 13}));
}

TEST(RotatingKVCache, TrimOnlyBeforeWrap) {
  RotatingKVCache c(8);
  c.update(token_rows(5, 0), token_rows(5, 0));
  EXPECT_TRUE(c.can_trim(2));
  EXPECT_EQ(c.trim(2), 2);
  const KVView v = c.update(token_rows(1, 3), token_rows(1, 3));
  EXPECT_EQ(view_positions(v), (std::vector<int64_t>{0, 1, 2, 3}));
  c.update(token_rows(6, 4), token_rows(6, 4));
  EXPECT_FALSE(c.can_trim(1));
  EXPECT_EQ(c.trim(1), 0);
}

TEST(CacheState, RestoreRejectsOtherKindsAndWindows) {
  KVCache kv;
  kv.update(token_rows(2, 0), token_rows(2, 0));
  RotatingKVCache rot(4);
  EXPECT_THROW(rot.restore(kv.state()), Error);
  RotatingKVCache other(8);
  other.update(token_rows(2, 0), token_rows(2, 0));
  EXPECT_THROW(rot.restore(other.state()), Error);
}

// Snapshot mid-generation, restore into fresh caches, continue: logits must be bit-identical.
void expect_round_trip(const std::string& fixture) {
  auto model = load_model(test::model_dir(fixture));
  const auto ref = test::load_reference(fixture);
  const auto& ids = ref.prompts.at("long");
  CacheList a = model->make_cache();
  model->forward(std::vector<int32_t>(ids.begin(), ids.begin() + 20), a, false);
  for (size_t t = 20; t < 25; ++t) model->forward({ids[t]}, a, false);
  CacheList b = model->make_cache();
  for (size_t i = 0; i < a.size(); ++i) b[i]->restore(a[i]->state());
  for (size_t t = 25; t < ids.size(); ++t) {
    const auto la = model->forward({ids[t]}, a, false).to_floats();
    const auto lb = model->forward({ids[t]}, b, false).to_floats();
    ASSERT_EQ(la, lb) << fixture << " step " << t;
  }
}

TEST(CacheState, SnapshotRestoreContinuesBitIdentically) {
  expect_round_trip("qwen3-bf16");    // kv caches
  expect_round_trip("gemma3-q4g64");  // rotating (window 8, wrapped) + kv
}

}  // namespace
}  // namespace lathe
