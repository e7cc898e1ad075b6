// The batched forward (Model::forward(const Batch&)) against per-sequence forwards on every fixture
// architecture: rows of mixed prefill chunks and decode tokens, rows joining and leaving between steps, sliding
// windows that wrap, KV-shared layers, MoE, SSM state per sequence, quantized KV. Logits within 1e-5 (CPU f32)
// and greedy decoding token for token.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include <gtest/gtest.h>

#include "common/error.h"
#include "common/fixture_reference.h"
#include "model/model.h"

namespace lathe {
namespace {

struct BatchedCase {
  std::string model;
  int kv_bits = 0;
};

std::string case_name(const ::testing::TestParamInfo<BatchedCase>& info) {
  std::string n = info.param.model + (info.param.kv_bits ? "_kv" + std::to_string(info.param.kv_bits) : "");
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, static_cast<double>(std::fabs(a[i] - b[i])));
  return d;
}

std::vector<float> row_of(const Tensor& logits, int64_t row) {
  const std::vector<float> all = logits.to_floats();
  const size_t V = static_cast<size_t>(logits.dim(1));
  return {all.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(row) * V),
          all.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(row + 1) * V)};
}

class BatchedForward : public ::testing::TestWithParam<BatchedCase> {
 protected:
  void SetUp() override {
    model_ = load_model(testing::fixture_dir(GetParam().model));
    ref_ = testing::Reference::load(GetParam().model);
    options_.kv_bits = GetParam().kv_bits;
  }
  std::vector<int32_t> prompt(const char* key) const { return ref_.prompt(key); }
  std::unique_ptr<Model> model_;
  testing::Reference ref_;
  CacheOptions options_;
};

// One sequence's script: the tokens it runs at each step (empty = not in that step) and whether it wants logits.
struct Step {
  std::vector<int32_t> ids;
  bool want = true;
};

std::vector<int32_t> part(const std::vector<int32_t>& v, size_t a, size_t b) {
  return {v.begin() + static_cast<std::ptrdiff_t>(a), v.begin() + static_cast<std::ptrdiff_t>(std::min(b, v.size()))};
}

TEST_P(BatchedForward, MixedPrefillAndDecodeRowsEqualSoloForwards) {
  const std::vector<int32_t> chat = prompt("chat"), lng = prompt("long"), greedy = prompt("chat_greedy");
  // Four sequences over four steps: whole prefills, chunked prefills (a chunk that wants no logits), decode
  // tokens, a sequence that joins late and one that leaves early. The long ones run past the sliding window.
  const std::vector<std::vector<Step>> script = {
      {{chat}, {{7}}, {{11}}, {{3}}},
      {{part(lng, 0, 16), false}, {part(lng, 16, 40)}, {{5}}, {{9}}},
      {{}, {part(greedy, 0, 5)}, {part(greedy, 5, 60)}, {{2}}},
      {{{1}}, {{4}}, {}, {}},
  };
  const size_t steps = 4;
  // Solo: each sequence on its own, one forward per step.
  std::vector<std::vector<std::vector<float>>> solo(script.size());
  std::vector<int64_t> solo_offsets;
  for (const auto& seq : script) {
    CacheList caches = model_->make_cache(options_);
    auto& out = solo[&seq - script.data()];
    for (const Step& st : seq)
      out.push_back(st.ids.empty() ? std::vector<float>() : row_of(model_->forward(st.ids, caches, false), 0));
    solo_offsets.push_back(caches[0]->offset());
  }
  // Batched: one forward per step over the sequences in it, rows in a different order each step.
  std::vector<CacheList> caches;
  for (size_t s = 0; s < script.size(); ++s) caches.push_back(model_->make_cache(options_));
  double worst = 0;
  for (size_t k = 0; k < steps; ++k) {
    Batch batch;
    std::vector<size_t> order;
    for (size_t s = 0; s < script.size(); ++s)
      if (!script[s][k].ids.empty()) order.push_back(s);
    if (k % 2 == 1) std::reverse(order.begin(), order.end());
    for (size_t s : order) batch.rows.push_back({script[s][k].ids, &caches[s], script[s][k].want, -1});
    const Tensor logits = model_->forward(batch);
    ASSERT_EQ(logits.defined() ? logits.dim(0) : 0, batch.logit_rows());
    int64_t row = 0;
    for (size_t s : order) {
      if (!script[s][k].want) continue;
      // f32 sums over other row counts may round differently (the matmul kernels block rows): 1e-5 relative to
      // the logits' scale.
      double scale = 1;
      for (float v : solo[s][k]) scale = std::max(scale, static_cast<double>(std::fabs(v)));
      const double d = max_abs_diff(row_of(logits, row++), solo[s][k]) / scale;
      worst = std::max(worst, d);
      EXPECT_LE(d, 1e-5) << GetParam().model << " step " << k << " sequence " << s;
    }
  }
  for (size_t s = 0; s < script.size(); ++s) EXPECT_EQ(caches[s][0]->offset(), solo_offsets[s]);
  std::printf("[batched] %-16s kv%d max|batched - solo| / max|logit| %.3g\n", GetParam().model.c_str(),
              GetParam().kv_bits, worst);
}

TEST_P(BatchedForward, BatchedGreedyEqualsSoloGreedy) {
  const std::vector<std::vector<int32_t>> prompts = {prompt("chat"), prompt("one"), part(prompt("long"), 0, 23),
                                                     prompt("chat_greedy")};
  const std::vector<size_t> joins = {0, 0, 2, 5};  // the step at which each sequence is admitted
  const size_t new_tokens = 10;
  std::vector<std::vector<int32_t>> solo(prompts.size());
  for (size_t s = 0; s < prompts.size(); ++s) {
    CacheList caches = model_->make_cache(options_);
    int32_t tok = argmax_rows(model_->forward(prompts[s], caches, false))[0];
    solo[s].push_back(tok);
    while (solo[s].size() < new_tokens) {
      tok = argmax_rows(model_->forward({tok}, caches, false))[0];
      solo[s].push_back(tok);
    }
  }
  std::vector<CacheList> caches;
  std::vector<std::vector<int32_t>> batched(prompts.size());
  for (size_t s = 0; s < prompts.size(); ++s) caches.push_back(model_->make_cache(options_));
  for (size_t k = 0; k < new_tokens + joins.back(); ++k) {
    Batch batch;
    std::vector<size_t> in;
    for (size_t s = 0; s < prompts.size(); ++s) {
      if (k < joins[s] || batched[s].size() >= new_tokens) continue;
      in.push_back(s);
      batch.rows.push_back(
          {k == joins[s] ? prompts[s] : std::vector<int32_t>{batched[s].back()}, &caches[s], true, -1});
    }
    if (in.empty()) continue;
    const std::vector<int32_t> next = argmax_rows(model_->forward(batch));
    ASSERT_EQ(next.size(), in.size());
    for (size_t i = 0; i < in.size(); ++i) batched[in[i]].push_back(next[i]);
  }
  for (size_t s = 0; s < prompts.size(); ++s) EXPECT_EQ(batched[s], solo[s]) << GetParam().model << " sequence " << s;
}

TEST_P(BatchedForward, BadBatchesAreRejected) {
  CacheList a = model_->make_cache(options_);
  Batch empty;
  EXPECT_THROW(model_->forward(empty), Error);
  Batch no_tokens;
  no_tokens.rows.push_back({{}, &a, true, -1});
  EXPECT_THROW(model_->forward(no_tokens), Error);
  Batch twice;
  twice.rows.push_back({{1}, &a, true, -1});
  twice.rows.push_back({{2}, &a, true, -1});
  EXPECT_THROW(model_->forward(twice), Error);
  EXPECT_EQ(a[0]->offset(), 0);  // nothing ran
}

INSTANTIATE_TEST_SUITE_P(Fixtures, BatchedForward,
                         ::testing::Values(BatchedCase{"llama-bf16"}, BatchedCase{"qwen3-bf16"},
                                           BatchedCase{"gemma3-bf16"}, BatchedCase{"gemma4-bf16"},
                                           BatchedCase{"gemma4moe-bf16"}, BatchedCase{"qwen3_5-bf16"},
                                           BatchedCase{"qwen3-q4g64", 8}, BatchedCase{"gemma3-q4g64", 4}),
                         case_name);

}  // namespace
}  // namespace lathe
