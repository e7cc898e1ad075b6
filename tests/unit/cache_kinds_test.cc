// The five cache kinds (kv, rotating, quantized, rotating_quantized, ssm): exact snapshot/restore (a restored
// cache continues decoding with bit-identical logits), trimming rules, byte accounting, and the quantized
// attention they rely on.
#include <cstring>
#include <random>
#include <set>

#include <gtest/gtest.h>

#include "cache/kv_block_pool.h"
#include "cache/quantized_kv_cache.h"
#include "cache/ssm_cache.h"
#include "common/error.h"
#include "common/fixture_reference.h"
#include "model/model.h"
#include "quant/affine.h"

namespace lathe {
namespace {

Tensor random_tensor(const Shape& shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (float& x : v) x = dist(rng);
  return Tensor::from_floats(v, shape);
}

bool bit_identical(const Tensor& a, const Tensor& b) {
  const Tensor x = a.contiguous(), y = b.contiguous();
  return x.shape() == y.shape() && x.dtype() == y.dtype() && std::memcmp(x.raw(), y.raw(), x.nbytes()) == 0;
}

struct RoundTripCase {
  const char* model;
  int kv_bits;
};

class CacheRoundTrip : public ::testing::TestWithParam<RoundTripCase> {};

// The fixture's caches after a 12-token prefill (past the sliding window) and 3 decode steps.
struct DecodedCaches {
  std::unique_ptr<Model> model;
  std::vector<int32_t> ids;
  CacheOptions opts;
  CacheList caches;
};
DecodedCaches prefill_and_decode(const RoundTripCase& c) {
  DecodedCaches r;
  r.model = load_model(testing::fixture_dir(c.model));
  r.ids = testing::Reference::load(c.model).prompt("long");
  r.opts.kv_bits = c.kv_bits;
  r.opts.kv_group_size = 32;
  r.caches = r.model->make_cache(r.opts);
  r.model->forward({r.ids.begin(), r.ids.begin() + 12}, r.caches, false);
  for (size_t i = 12; i < 15; ++i) r.model->forward({r.ids[i]}, r.caches, false);
  return r;
}

// Prefill past the sliding window, decode a few tokens, snapshot every cache, restore into fresh caches, then
// decode the same tokens on both: the logits must be bit-identical.
TEST_P(CacheRoundTrip, SnapshotRestoreContinuesBitIdentically) {
  const RoundTripCase c = GetParam();
  DecodedCaches run = prefill_and_decode(c);
  auto& model = run.model;
  const std::vector<int32_t>& ids = run.ids;
  const CacheOptions& opts = run.opts;
  CacheList& caches = run.caches;

  CacheList restored = model->make_cache(opts);
  ASSERT_EQ(restored.size(), caches.size());
  for (size_t i = 0; i < caches.size(); ++i) {
    restored[i]->restore(caches[i]->state());
    EXPECT_EQ(restored[i]->offset(), caches[i]->offset());
    EXPECT_STREQ(restored[i]->kind(), caches[i]->kind());
  }
  for (size_t i = 15; i < 25; ++i) {
    const Tensor a = model->forward({ids[i]}, caches, false);
    const Tensor b = model->forward({ids[i]}, restored, false);
    ASSERT_TRUE(bit_identical(a, b)) << c.model << " kv_bits " << c.kv_bits << " step " << i;
  }
  // A restored prefill chunk (several tokens at once) continues identically too.
  const Tensor a = model->forward({ids.begin() + 25, ids.begin() + 30}, caches, true);
  const Tensor b = model->forward({ids.begin() + 25, ids.begin() + 30}, restored, true);
  EXPECT_TRUE(bit_identical(a, b));
}

// The prompt cache's RAM tier forks a kept or running sequence's caches at a shared prefix: paged layers share
// blocks, the rest (rings, SSM states, contiguous device buffers) are copied. A fork at the caches' own length
// continues exactly as the original; rings that have dropped tokens, and SSM states, fork at that length only.
TEST_P(CacheRoundTrip, ForkContinuesBitIdentically) {
  const RoundTripCase c = GetParam();
  DecodedCaches run = prefill_and_decode(c);
  auto& model = run.model;
  const std::vector<int32_t>& ids = run.ids;
  const CacheOptions& opts = run.opts;
  CacheList& caches = run.caches;
  const int64_t n = caches[0]->offset();
  ASSERT_TRUE(can_fork_cache_list(caches, n));
  std::optional<CacheList> forked = fork_cache_list(caches, n);
  ASSERT_TRUE(forked);
  for (size_t i = 0; i < caches.size(); ++i) {
    const std::string kind = caches[i]->kind();
    EXPECT_EQ((*forked)[i]->kind(), kind);
    EXPECT_EQ((*forked)[i]->offset(), n);
    // Shorter: growing caches fork anywhere; a ring past its window (8 here) and an SSM state do not.
    const bool shorter = kind == "kv" || kind == "quantized";
    EXPECT_EQ(caches[i]->can_fork(n - 1), shorter) << kind;
    if (!shorter) {
      EXPECT_EQ(caches[i]->fork(n - 1), nullptr) << kind;
    }
  }
  for (size_t i = 15; i < 22; ++i) {
    const Tensor a = model->forward({ids[i]}, caches, false);
    const Tensor b = model->forward({ids[i]}, *forked, false);
    ASSERT_TRUE(bit_identical(a, b)) << c.model << " kv_bits " << c.kv_bits << " step " << i;
  }
  // The fork owns its rows: the original going on (or away) leaves it as it was.
  const Tensor b = model->forward({ids.begin() + 22, ids.begin() + 26}, *forked, true);
  caches.clear();
  CacheList again = model->make_cache(opts);
  model->forward({ids.begin(), ids.begin() + 12}, again, false);
  for (size_t i = 12; i < 22; ++i) model->forward({ids[i]}, again, false);
  EXPECT_TRUE(bit_identical(model->forward({ids.begin() + 22, ids.begin() + 26}, again, true), b));
}

INSTANTIATE_TEST_SUITE_P(Kinds, CacheRoundTrip,
                         ::testing::Values(RoundTripCase{"gemma4-bf16", 0},  // kv + rotating
                                           RoundTripCase{"gemma4-bf16", 4},  // quantized + rotating_quantized
                                           RoundTripCase{"gemma4moe-q4g64", 8},
                                           RoundTripCase{"qwen3_5-bf16", 0},     // ssm + kv
                                           RoundTripCase{"qwen3_5-q4g64", 8}));  // ssm + quantized

TEST(CacheKinds, ModelsCreateEveryKind) {
  std::set<std::string> kinds;
  for (const char* m : {"gemma4-bf16", "qwen3_5-bf16"})
    for (int bits : {0, 4}) {
      CacheOptions o;
      o.kv_bits = bits;
      for (const auto& c : load_model(testing::fixture_dir(m))->make_cache(o)) kinds.insert(c->kind());
    }
  EXPECT_EQ(kinds, (std::set<std::string>{"kv", "rotating", "quantized", "rotating_quantized", "ssm"}));
}

TEST(CacheKinds, KvSharedModelHasCachesForDonorsOnly) {
  auto model = load_model(testing::fixture_dir("gemma4-bf16"));  // 6 layers, the last 2 share K/V
  EXPECT_EQ(model->make_cache().size(), 4u);
}

TEST(CacheKinds, TrimRules) {
  const Tensor k = random_tensor({10, 2, 32}, 1), v = random_tensor({10, 2, 32}, 2);
  KVCache kv;
  QuantizedKVCache qkv(8, 32);
  for (LayerCache* c : std::initializer_list<LayerCache*>{&kv, &qkv}) {
    c->update(k, v);
    EXPECT_TRUE(c->can_trim(10));
    EXPECT_FALSE(c->can_trim(11));
    EXPECT_EQ(c->trim(4), 4);
    EXPECT_EQ(c->offset(), 6);
  }
  // Rotating kinds: trimmable before the ring wraps, not after.
  RotatingKVCache rot(16);
  RotatingQuantizedKVCache qrot(16, 4, 32);
  for (LayerCache* c : std::initializer_list<LayerCache*>{&rot, &qrot}) {
    c->update(k, v);
    EXPECT_TRUE(c->can_trim(3));
    EXPECT_EQ(c->trim(3), 3);
    EXPECT_EQ(c->offset(), 7);
    c->update(k, v);  // 17 tokens seen: the window has dropped some
    EXPECT_FALSE(c->can_trim(1));
    EXPECT_EQ(c->trim(1), 0);
    EXPECT_TRUE(c->can_trim(0));  // dropping nothing always works (a request extending the whole ring)
  }
  SSMCache ssm;
  ssm.conv_state(3, 8);
  ssm.recurrent_state(2, 4, 4);
  ssm.advance(5);
  EXPECT_TRUE(ssm.can_trim(0));
  EXPECT_FALSE(ssm.can_trim(1));
  EXPECT_EQ(ssm.trim(1), 0);
  EXPECT_EQ(ssm.offset(), 5);
}

// Copies where blocks cannot be shared: a contiguous KVCache forks at any length up to its offset, a ring
// before it wraps (after, only at its own length), and each fork goes on independently of its source.
TEST(CacheKinds, ForkCopiesContiguousAndRingRows) {
  const Tensor k = random_tensor({10, 2, 32}, 5), v = random_tensor({10, 2, 32}, 6);
  const Tensor k1 = random_tensor({1, 2, 32}, 7), v1 = random_tensor({1, 2, 32}, 8);
  KVCache kv;
  kv.update(k, v);
  EXPECT_FALSE(kv.can_fork(11));
  std::unique_ptr<LayerCache> f = kv.fork(6);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->offset(), 6);
  KVCache fresh;
  fresh.update(k.slice(0, 0, 6), v.slice(0, 0, 6));
  const KVView a = f->update(k1, v1), b = fresh.update(k1, v1);
  EXPECT_TRUE(bit_identical(a.k, b.k));
  EXPECT_TRUE(bit_identical(a.v, b.v));
  EXPECT_EQ(kv.offset(), 10);  // the source is untouched
  EXPECT_TRUE(bit_identical(kv.update(k1, v1).k.slice(0, 0, 10), k));

  for (int bits : {0, 4}) {
    std::unique_ptr<LayerCache> ring = bits ? std::unique_ptr<LayerCache>(new RotatingQuantizedKVCache(16, bits, 32))
                                            : std::unique_ptr<LayerCache>(new RotatingKVCache(16));
    ring->update(k, v);
    ASSERT_TRUE(ring->can_fork(4));
    std::unique_ptr<LayerCache> early = ring->fork(4);
    EXPECT_EQ(early->offset(), 4);
    EXPECT_EQ(early->state().meta.at("idx"), 4);
    ring->update(k, v);  // 20 tokens: wrapped
    EXPECT_FALSE(ring->can_fork(19));
    EXPECT_EQ(ring->fork(19), nullptr);
    ASSERT_TRUE(ring->can_fork(20));
    std::unique_ptr<LayerCache> whole = ring->fork(20);
    const CacheState want = ring->state(), got = whole->state();
    EXPECT_EQ(got.meta, want.meta);
    ASSERT_EQ(got.tensors.size(), want.tensors.size());
    for (size_t i = 0; i < got.tensors.size(); ++i)
      EXPECT_TRUE(bit_identical(got.tensors[i].second, want.tensors[i].second)) << bits << " " << i;
  }
  SSMCache ssm;
  ssm.conv_state(3, 8);
  ssm.recurrent_state(2, 4, 4);
  ssm.advance(5);
  EXPECT_FALSE(ssm.can_fork(4));
  ASSERT_TRUE(ssm.can_fork(5));
  std::unique_ptr<LayerCache> s2 = ssm.fork(5);
  EXPECT_EQ(s2->offset(), 5);
  EXPECT_EQ(s2->bytes(), ssm.bytes());
}

TEST(CacheKinds, BytesAndRestoreChecks) {
  const Tensor k = random_tensor({256, 8, 128}, 3), v = random_tensor({256, 8, 128}, 4);
  KVCache kv;
  QuantizedKVCache q8(8, 64), q4(4, 64);
  kv.update(k, v);
  q8.update(k, v);
  q4.update(k, v);
  EXPECT_EQ(kv.bytes(), 256u * 8 * 128 * 4 * 2);
  // Codes + f32 scale/bias per 64 values, K and V, for the tokens the storage holds: on the CPU whole blocks
  // of the KV pool (their pages exist once written).
  ASSERT_TRUE(q8.paged() && q4.paged());
  const auto held = static_cast<size_t>(q8.paged_rows()->block_tokens());
  EXPECT_EQ(held, 1024u);
  EXPECT_EQ(q8.bytes(), held * 8 * (128 + 2 * 2 * 4) * 2);
  EXPECT_EQ(q4.bytes(), held * 8 * (64 + 2 * 2 * 4) * 2);
  QuantizedKVCache other(4, 32);
  EXPECT_THROW(other.restore(q4.state()), Error);  // another group size
  EXPECT_THROW(kv.restore(q4.state()), Error);     // another kind
}

TEST(QuantizedAttention, MatchesAttentionOverDequantizedInputs) {
  const Tensor q = random_tensor({5, 4, 64}, 6), k = random_tensor({9, 2, 64}, 7), v = random_tensor({9, 2, 64}, 8);
  const QuantizedMatrix qk = quant::quantize(k.data<float>(), 18, 64, 4, 32, DType::F32);
  const QuantizedMatrix qv = quant::quantize(v.data<float>(), 18, 64, 4, 32, DType::F32);
  AttentionParams p;
  p.scale = 0.125f;
  p.q_pos0 = 4;
  const Tensor want = attention(q, dequantize(qk).reshape({9, 2, 64}), dequantize(qv).reshape({9, 2, 64}), p);
  const Tensor got = attention_quantized(q, qk, qv, 2, p);
  EXPECT_TRUE(bit_identical(want, got));
}

}  // namespace
}  // namespace lathe
