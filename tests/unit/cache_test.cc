// KVCache and RotatingKVCache: what attention sees, exact snapshot/restore, trim rules.
#include <gtest/gtest.h>

#include <random>

#include "cache/layer_cache.h"
#include "common/error.h"
#include "model/model.h"
#include "support/fixtures.h"
#include "tensor/ops.h"

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
