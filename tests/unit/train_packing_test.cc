// Sequence packing: a packed row (block-diagonal causal attention, positions restarting per example) gives the
// loss and every LoRA gradient of its examples run unpacked, on the tiny fixture models (llama, 4-bit qwen3,
// gemma3 with sliding layers); pack_examples keeps every token once and cuts rows and padding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "common/error.h"
#include "lab/train/lora_engine_cpu.h"
#include "lab/train/train_losses.h"
#include "lab/train/train_packing.h"
#include "model/model.h"
#include "support/fixtures.h"
#include "support/lora_test_util.h"

namespace lathe::train {
namespace {

// SFT-shaped examples: a prompt of `prompt` tokens (no loss), then targets.
Example example(std::mt19937& g, int64_t vocab, int len, int prompt) {
  std::uniform_int_distribution<int32_t> tok(3, static_cast<int32_t>(vocab - 1));
  Example e;
  e.format = RowFormat::PromptCompletion;
  for (int j = 0; j < len; ++j) e.seq.ids.push_back(tok(g));
  e.seq.target.assign(static_cast<size_t>(len), 0);
  for (int j = prompt; j < len; ++j) e.seq.target[static_cast<size_t>(j)] = 1;
  e.where = "test:" + std::to_string(len);
  return e;
}

struct GradRun {
  double loss = 0;
  std::vector<std::vector<float>> grads;  // a0, b0, a1, b1, ...
};

GradRun run(LoraGradientEngine& engine, LoraParams& ps, const std::vector<TrainSequence>& batch) {
  zero_grads(ps);
  const LossResult l = sft_loss(engine.forward(batch, true));
  engine.backward(l.weight);
  GradRun r;
  r.loss = l.loss;
  for (const LoraParam& p : ps.params)
    for (const Tensor* t : {&p.grad_a, &p.grad_b})
      r.grads.emplace_back(t->data<float>(), t->data<float>() + t->numel());
  return r;
}

class TrainPackingParity : public ::testing::TestWithParam<std::string> {};

TEST_P(TrainPackingParity, PackedRowEqualsItsExamplesUnpacked) {
  LoadOptions lo;
  lo.exact = true;
  const auto model = load_model(test::model_dir(GetParam()), lo);
  const int64_t vocab = model->config().vocab_size;
  LoraParams ps = all_targets(model->config(), 2, 5);
  auto engine = make_cpu_lora_gradient_engine(*model, ps);
  std::mt19937 g(11);
  // Longer than gemma3's fixture sliding window in total, so a window crossing a boundary would show.
  const std::vector<Example> ex = {example(g, vocab, 9, 3), example(g, vocab, 5, 1), example(g, vocab, 7, 4),
                                   example(g, vocab, 6, 2)};
  std::vector<TrainSequence> unpacked;
  for (const Example& e : ex) unpacked.push_back(e.seq);
  const std::vector<Example> rows = pack_examples(ex, 64);
  ASSERT_EQ(rows.size(), 1u);
  ASSERT_EQ(rows[0].seq.segments.size(), ex.size());
  const GradRun u = run(*engine, ps, unpacked);
  const GradRun p = run(*engine, ps, {rows[0].seq});
  EXPECT_NEAR(p.loss, u.loss, 1e-5 * std::abs(u.loss));
  ASSERT_EQ(p.grads.size(), u.grads.size());
  for (size_t k = 0; k < u.grads.size(); ++k) {
    float gmax = 0;
    for (float x : u.grads[k]) gmax = std::max(gmax, std::abs(x));
    ASSERT_GT(gmax, 0.0f) << ps.params[k / 2].module;
    for (size_t e = 0; e < u.grads[k].size(); ++e)
      ASSERT_NEAR(p.grads[k][e], u.grads[k][e], 1e-5 * gmax)
          << ps.params[k / 2].module << (k % 2 ? ".lora_b[" : ".lora_a[") << e << "]";
  }
  // The same row without its segments (one long example: attention and positions cross) is another loss: the
  // comparison above can tell.
  TrainSequence plain = rows[0].seq;
  plain.segments.clear();
  EXPECT_GT(std::abs(run(*engine, ps, {plain}).loss - u.loss), 1e-4 * std::abs(u.loss));
  // Bad segment lists are refused.
  TrainSequence bad = rows[0].seq;
  bad.segments.back() += 1;
  EXPECT_THROW(engine->forward({bad}, true), Error);
  bad = rows[0].seq;
  bad.target[static_cast<size_t>(bad.segments[0])] = 1;  // the second example's first token
  EXPECT_THROW(engine->forward({bad}, true), Error);
}

INSTANTIATE_TEST_SUITE_P(Models, TrainPackingParity, ::testing::Values("llama-bf16", "qwen3-q4g64", "gemma3-bf16"));

TEST(TrainPacking, KeepsEveryTokenOnceAndCutsRowsAndPadding) {
  std::mt19937 g(4);
  std::uniform_int_distribution<int> len(3, 24);
  std::vector<Example> ex;
  for (int i = 0; i < 200; ++i) {
    const int n = len(g);
    ex.push_back(example(g, 500, n, std::min(n - 1, 2)));
  }
  ex.push_back(example(g, 500, 64, 2));  // one full-length row
  const int64_t max_seq = 64;
  const std::vector<Example> rows = pack_examples(ex, max_seq);
  // Every example once, whole, in some row; no row over max_seq; no target on an example's first token.
  std::vector<std::vector<int32_t>> in, out;
  for (const Example& e : ex) in.push_back(e.seq.ids);
  int64_t total = 0;
  for (const Example& r : rows) {
    ASSERT_LE(static_cast<int64_t>(r.seq.ids.size()), max_seq);
    ASSERT_EQ(r.seq.target.size(), r.seq.ids.size());
    std::vector<int64_t> segs = r.seq.segments;
    if (segs.empty()) segs = {static_cast<int64_t>(r.seq.ids.size())};
    int64_t at = 0;
    for (int64_t s : segs) {
      EXPECT_EQ(r.seq.target[static_cast<size_t>(at)], 0);
      out.emplace_back(r.seq.ids.begin() + at, r.seq.ids.begin() + at + s);
      at += s;
    }
    EXPECT_EQ(at, static_cast<int64_t>(r.seq.ids.size()));
    total += at;
  }
  std::sort(in.begin(), in.end());
  std::sort(out.begin(), out.end());
  EXPECT_EQ(in, out);
  // 200 examples of mean ~13.5 tokens fill about 43 rows of 64; best-fit decreasing stays close to that.
  const int64_t lower = (total + max_seq - 1) / max_seq;
  EXPECT_LE(static_cast<int64_t>(rows.size()), lower + 2);
  const PaddingStats a = padding_stats(ex, 8, 3), b = padding_stats(rows, 8, 3);
  EXPECT_LT(b.rows * 3, a.rows);
  // Length buckets already keep padding low for sorted short rows; packing must not add any on top.
  EXPECT_LT(b.pad_tokens, a.pad_tokens) << "packed " << b.pad_tokens << " vs " << a.pad_tokens;
  // Deterministic.
  const std::vector<Example> again = pack_examples(ex, max_seq);
  ASSERT_EQ(again.size(), rows.size());
  for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(again[i].seq.ids, rows[i].seq.ids);
}

TEST(TrainPacking, RefusesWhatCannotBePacked) {
  std::mt19937 g(1);
  std::vector<Example> ex = {example(g, 100, 10, 2)};
  EXPECT_THROW(pack_examples(ex, 8), Error);  // longer than a row
  Example pref = example(g, 100, 6, 2);
  pref.format = RowFormat::Preference;
  pref.rejected = pref.seq;
  EXPECT_THROW(pack_examples({pref}, 64), Error);
}

}  // namespace
}  // namespace lathe::train
