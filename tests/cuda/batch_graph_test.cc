// Batched decode steps replayed from CUDA graphs (model/batch_graph.h) against the same steps run eagerly: rows
// joining and leaving, batch sizes on and between the buckets, contexts growing past a cache's first buffer
// (so a replay grows it). Batches that fill their bucket run the same kernels either way: bitwise equal.
// Padded ones run the M-row linears over more rows: within a few bf16 steps of the logits' scale. Each runs
// over full-precision, 8-bit and 4-bit K/V caches (quantized caches rewrite copy and attention tables per
// replay); solo steps over quantized caches replay a bucket of one row.
#include <algorithm>
#include <cstdio>

#include "cuda/cuda_test_util.h"
#include "model/batch_graph.h"
#include "model/model.h"
#include "support/fixtures.h"
#include "tensor/ops_extra.h"

namespace lathe {
namespace {
using namespace testing_cuda;

struct GraphRun {
  std::vector<std::vector<float>> logits;  // per step, all rows
  std::vector<size_t> rows;                // per step
};

// The script: step k runs the sequences live at k; each feeds the token `feed` says for it.
GraphRun run_script(Model& model, const std::vector<std::vector<int32_t>>& prompts, int steps,
                    const std::vector<std::pair<int, int>>& live, const std::vector<std::vector<int32_t>>& feed,
                    const CacheOptions& options) {
  std::vector<CacheList> caches;
  for (const auto& p : prompts) {
    caches.push_back(model.make_cache(options));
    model.forward(p, caches.back(), false);
  }
  GraphRun out;
  for (int k = 0; k < steps; ++k) {
    Batch batch;
    std::vector<size_t> seqs;
    for (size_t s = 0; s < prompts.size(); ++s)
      if (k >= live[s].first && k < live[s].second) seqs.push_back(s);
    for (size_t s : seqs) {
      const int32_t id = feed[s][static_cast<size_t>(k - live[s].first)];
      batch.rows.push_back({{id}, &caches[s], true, -1});
    }
    if (batch.rows.empty()) continue;
    const Tensor logits = model.forward(batch);
    out.logits.push_back(logits.to_floats());
    out.rows.push_back(seqs.size());
  }
  return out;
}

class CudaBatchGraphs : public ::testing::TestWithParam<int> {  // K/V bits (0: full precision)
 protected:
  CacheOptions options() const {
    CacheOptions o;
    o.kv_bits = GetParam();
    return o;
  }
};

TEST_P(CudaBatchGraphs, ReplaysMatchEagerSteps) {
  LATHE_REQUIRE_GPU();
  if (!batch_graphs_enabled()) GTEST_SKIP() << "batch graphs are off (LATHE_CUDA_BATCH_GRAPHS=0)";
  const test::Reference ref = test::load_reference("qwen3-q4g64");
  auto model = load_model(test::model_dir("qwen3-q4g64"), LoadOptions{Device::CUDA, DType::BF16});
  const auto& chat = ref.prompts.at("chat");
  const auto& lng = ref.prompts.at("long");
  // 12 sequences of different lengths; live ranges give batches of 4..12 rows (4 and 8 fill their buckets).
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::pair<int, int>> live;
  for (int s = 0; s < 12; ++s) {
    const auto& src = s % 2 ? chat : lng;
    prompts.emplace_back(src.begin(), src.begin() + std::min<std::ptrdiff_t>(3 + 5 * s, std::ssize(src)));
    live.emplace_back(s < 4 ? 0 : 2 * s, s < 8 ? 300 : 120 + 10 * s);
  }
  std::vector<std::vector<int32_t>> feed(prompts.size());  // tokens both runs feed, far below the vocabulary
  for (size_t s = 0; s < prompts.size(); ++s)
    for (int k = 0; k < 400; ++k) feed[s].push_back(static_cast<int32_t>((7 * k + 13 * s) % 97 + 1));
  set_batch_graphs_enabled(false);
  const GraphRun eager = run_script(*model, prompts, 300, live, feed, options());
  set_batch_graphs_enabled(true);
  const int64_t replays0 = batch_graph_replays();
  const GraphRun graphed = run_script(*model, prompts, 300, live, feed, options());
  const int64_t replays = batch_graph_replays() - replays0;
  ASSERT_EQ(eager.logits.size(), graphed.logits.size());
  EXPECT_GT(replays, 250) << "most steps should replay a graph";
  size_t bitwise = 0;
  double worst = 0;
  for (size_t k = 0; k < eager.logits.size(); ++k) {
    const size_t n = eager.rows[k];
    const bool full = n == 2 || n == 4 || n == 8 || n == 16;
    const auto& a = eager.logits[k];
    const auto& b = graphed.logits[k];
    ASSERT_EQ(a.size(), b.size());
    if (full) {
      EXPECT_TRUE(a == b) << "step " << k << " (" << n << " rows) differs from its eager run";
      ++bitwise;
    } else {
      const double d = max_abs_diff(a, b) / std::max(1.0f, max_abs(a));
      worst = std::max(worst, d);
      EXPECT_LE(d, 3e-2) << "step " << k << " (" << n << " rows)";
    }
  }
  EXPECT_GE(bitwise, 70u);
  std::printf("[batch graphs, kv_bits %d] %lld replays of %zu steps, %zu bitwise, padded worst %.3g\n", GetParam(),
              static_cast<long long>(replays), eager.logits.size(), bitwise, worst);
}

// One sequence alone: over quantized K/V (which the single-step graph cannot replay in place) its steps replay
// a one-row bucket, bitwise their eager runs, past the first buffer of its caches.
TEST_P(CudaBatchGraphs, SoloStepsReplayOverQuantizedCaches) {
  LATHE_REQUIRE_GPU();
  if (GetParam() == 0) GTEST_SKIP() << "full-precision solo steps replay the single-step graph";
  if (!batch_graphs_enabled()) GTEST_SKIP() << "batch graphs are off (LATHE_CUDA_BATCH_GRAPHS=0)";
  const test::Reference ref = test::load_reference("qwen3-q4g64");
  auto model = load_model(test::model_dir("qwen3-q4g64"), LoadOptions{Device::CUDA, DType::BF16});
  const auto& chat = ref.prompts.at("chat");
  const std::vector<std::vector<int32_t>> prompts = {chat};
  std::vector<std::vector<int32_t>> feed(1);
  for (int k = 0; k < 300; ++k) feed[0].push_back(static_cast<int32_t>((11 * k) % 89 + 2));
  const std::vector<std::pair<int, int>> live = {{0, 300}};
  set_batch_graphs_enabled(false);
  const GraphRun eager = run_script(*model, prompts, 300, live, feed, options());
  set_batch_graphs_enabled(true);
  const int64_t replays0 = batch_graph_replays();
  const GraphRun graphed = run_script(*model, prompts, 300, live, feed, options());
  EXPECT_GE(batch_graph_replays() - replays0, 290) << "solo steps over quantized caches should replay a graph";
  ASSERT_EQ(eager.logits.size(), graphed.logits.size());
  for (size_t k = 0; k < eager.logits.size(); ++k)
    EXPECT_TRUE(eager.logits[k] == graphed.logits[k]) << "step " << k << " differs from its eager run";
}

INSTANTIATE_TEST_SUITE_P(KvBits, CudaBatchGraphs, ::testing::Values(0, 8, 4),
                         [](const ::testing::TestParamInfo<int>& i) { return "kv" + std::to_string(i.param); });

}  // namespace
}  // namespace lathe
