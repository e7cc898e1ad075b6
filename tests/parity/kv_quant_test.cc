// Quantized KV caches on the fixtures' `long` prompt (40 tokens, past the sliding windows): next-token KL
// divergence of the quantized-KV logits from the f32-KV logits at every position, and top-1 agreement, for
// 4- and 8-bit KV with group sizes 32 and 64 (8-bit must agree on ≥ 99% of positions). Also prints the KV bytes
// per token of each cache kind (docs/benchmarks/cache.md, "KV cache kinds"). Top-1 agreement is reported over all
// positions and over the positions whose reference top-1 is not a near-tie (see kKvQuantTieMargin).
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>

#include <gtest/gtest.h>

#include "cache/quantized_kv_cache.h"
#include "cache/ssm_cache.h"
#include "common/fixture_reference.h"
#include "model/model.h"
#include "support/test_util.h"

namespace lathe {
namespace {

using testutil::log_softmax;

// The tiny random fixtures have many near-tied top-2 logits; a position counts as decided when the reference's
// top-1 leads by at least this much (8-bit KV moves logits by ~1e-3 here).
constexpr float kKvQuantTieMargin = 1e-2f;

struct KvQuality {
  double mean_kl = 0, max_kl = 0, top1 = 0;
  int64_t decided = 0, decided_agree = 0;
  double top1_decided() const {
    return decided ? static_cast<double>(decided_agree) / static_cast<double>(decided) : 1.0;
  }
};

KvQuality compare(const Tensor& ref, const Tensor& got) {
  const std::vector<float> r = ref.to_floats(), g = got.to_floats();
  const int64_t T = ref.dim(0), V = ref.dim(1);
  KvQuality q;
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<double> lr = log_softmax(r.data() + t * V, V), lg = log_softmax(g.data() + t * V, V);
    double kl = 0;
    for (int64_t v = 0; v < V; ++v)
      kl += std::exp(lr[static_cast<size_t>(v)]) * (lr[static_cast<size_t>(v)] - lg[static_cast<size_t>(v)]);
    q.mean_kl += kl / static_cast<double>(T);
    q.max_kl = std::max(q.max_kl, kl);
    const float* rr = r.data() + t * V;
    const float* gg = g.data() + t * V;
    const bool agree = std::max_element(rr, rr + V) == rr + (std::max_element(gg, gg + V) - gg);
    std::vector<float> top(rr, rr + V);
    std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<float>());
    const bool decided = top[0] - top[1] >= kKvQuantTieMargin;
    q.top1 += agree ? 1.0 / static_cast<double>(T) : 0.0;
    q.decided += decided ? 1 : 0;
    q.decided_agree += decided && agree ? 1 : 0;
  }
  return q;
}

class KvQuant : public ::testing::TestWithParam<std::string> {};

TEST_P(KvQuant, NextTokenKlAndTop1OnLongPrompt) {
  auto model = load_model(testing::fixture_dir(GetParam()), LoadOptions{.exact = true});
  const std::vector<int32_t> ids = testing::Reference::load(GetParam()).prompt("long");
  CacheList plain = model->make_cache();
  const Tensor ref = model->forward(ids, plain, true);
  for (int bits : {4, 8})
    for (int group : {32, 64}) {
      CacheOptions o;
      o.kv_bits = bits;
      o.kv_group_size = group;
      // Prefill half, then decode token by token: both paths read the quantized cache.
      CacheList caches = model->make_cache(o);
      std::vector<Tensor> rows{model->forward({ids.begin(), ids.begin() + 20}, caches, true)};
      for (size_t i = 20; i < ids.size(); ++i) rows.push_back(model->forward({ids[i]}, caches, false));
      const KvQuality q = compare(ref, testing::stack_rows(rows));
      std::printf(
          "[kv-quant] %-16s %d-bit g%-2d mean KL %.3g max KL %.3g top-1 %.1f%% (all 40), %.1f%% of %lld decided\n",
          GetParam().c_str(), bits, group, q.mean_kl, q.max_kl, 100.0 * q.top1, 100.0 * q.top1_decided(),
          static_cast<long long>(q.decided));
      if (bits == 8) {
        EXPECT_GE(q.top1_decided(), 0.99) << GetParam() << " 8-bit g" << group;
        EXPECT_LT(q.max_kl, 1e-3) << GetParam() << " 8-bit g" << group;
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, KvQuant,
                         ::testing::Values("llama-bf16", "qwen3-bf16", "gemma3-bf16", "gemma4-bf16", "gemma4moe-bf16",
                                           "qwen3_5-bf16"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

// Bytes one cached token costs per layer, from each kind's exact state (no growth slack), for the fixtures'
// head shape (2 KV heads × 16) and a qwen3-4b-like one (8 KV heads × 128).
TEST(KvQuant, BytesPerTokenPerKind) {
  for (const auto& [heads, dim] : {std::pair<int64_t, int64_t>{2, 16}, {8, 128}}) {
    std::mt19937 rng(1);
    std::normal_distribution<float> dist;
    std::vector<float> v(static_cast<size_t>(64 * heads * dim));
    for (float& x : v) x = dist(rng);
    const Tensor kv = Tensor::from_floats(v, {64, heads, dim});
    std::vector<std::pair<std::string, std::unique_ptr<LayerCache>>> kinds;
    kinds.emplace_back("kv", std::make_unique<KVCache>());
    kinds.emplace_back("rotating(window 512)", std::make_unique<RotatingKVCache>(512));
    for (int bits : {8, 4})
      for (int g : {32, 64}) {
        const std::string tag = std::to_string(bits) + "-bit g" + std::to_string(g);
        kinds.emplace_back("quantized " + tag, std::make_unique<QuantizedKVCache>(bits, g));
        kinds.emplace_back("rotating_quantized " + tag, std::make_unique<RotatingQuantizedKVCache>(512, bits, g));
      }
    for (auto& [name, cache] : kinds) {
      cache->update(kv, kv);
      size_t bytes = 0;
      for (const auto& [n, t] : cache->state().tensors) bytes += t.nbytes();
      std::printf("[kv-bytes] heads %lld x %-3lld %-30s %8.1f bytes/token/layer\n", static_cast<long long>(heads),
                  static_cast<long long>(dim), name.c_str(), static_cast<double>(bytes) / 64.0);
      EXPECT_GT(bytes, 0u);
    }
  }
  // SSM state is per layer, not per token: the fixture's Gated DeltaNet and a Qwen3.5-27B-like layer.
  for (const auto& [conv_dim, hv, d] : {std::tuple<int64_t, int64_t, int64_t>{128, 4, 16}, {10240, 48, 128}}) {
    SSMCache ssm;
    ssm.conv_state(3, conv_dim);
    ssm.recurrent_state(hv, d, d);
    std::printf("[kv-bytes] ssm conv [3, %lld] + state [%lld, %lld, %lld] f32: %zu bytes/layer at any length\n",
                static_cast<long long>(conv_dim), static_cast<long long>(hv), static_cast<long long>(d),
                static_cast<long long>(d), ssm.bytes());
  }
}

}  // namespace
}  // namespace lathe
