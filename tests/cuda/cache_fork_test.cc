// Forking device caches (the prompt cache's RAM tier on CUDA): contiguous device K/V — full precision, 8-bit and
// 4-bit — is copied at the shared prefix. A fork decodes exactly as a cache that ran the same tokens, in batched
// steps (graph replays included, past its first buffer), and its source going on leaves it as it was. The
// scheduler then serves concurrent requests that share a kept prompt from copies of it, each with its solo tokens.
#include <memory>

#include "cache/kv_block_pool.h"
#include "cuda/cuda_test_util.h"
#include "engine/scheduler.h"
#include "model/model.h"
#include "support/fixtures.h"
#include "support/sequence_recorder.h"

namespace lathe {
namespace {
using testing_cuda::max_abs_diff;

class CudaCacheFork : public ::testing::TestWithParam<int> {  // K/V bits (0: full precision)
 protected:
  CacheOptions options() const {
    CacheOptions o;
    o.kv_bits = GetParam();
    return o;
  }
};

std::vector<int32_t> feed_tokens(int n) {
  std::vector<int32_t> out;
  for (int k = 0; k < n; ++k) out.push_back(static_cast<int32_t>((11 * k) % 89 + 2));
  return out;
}

TEST_P(CudaCacheFork, ForkDecodesLikeTheSameTokensRun) {
  LATHE_REQUIRE_GPU();
  const test::Reference ref = test::load_reference("qwen3-q4g64");
  auto model = load_model(test::model_dir("qwen3-q4g64"), LoadOptions{Device::CUDA, DType::BF16});
  const std::vector<int32_t>& chat = ref.prompts.at("chat");
  const std::vector<int32_t> feed = feed_tokens(320);
  // The three caches run in lockstep batches, so rows of the same tokens are the same launches' (solo steps and
  // batched ones may differ in the last bits): the chat prompt, 6 tokens, then 4 more for source and its twin.
  CacheList source = model->make_cache(options()), same = model->make_cache(options()),
            source_same = model->make_cache(options());
  {
    Batch b;
    for (CacheList* c : {&source, &same, &source_same}) b.rows.push_back({chat, c, false, -1});
    model->forward(b);
  }
  for (size_t k = 0; k < 10; ++k) {
    Batch b;
    for (CacheList* c : {&source, &same, &source_same})
      if (c != &same || k < 6) b.rows.push_back({{feed[k]}, c, true, -1});
    model->forward(b);
  }
  const int64_t n = source[0]->offset() - 4;  // inside what the source holds
  ASSERT_EQ(n, same[0]->offset());
  std::optional<CacheList> fork = fork_cache_list(source, n);
  ASSERT_TRUE(fork);
  for (const auto& c : *fork) ASSERT_EQ(c->offset(), n);
  // Four rows a step: the source and its twin go on from token 10, the fork and its twin from token 6. Each
  // pair runs the same inputs in the same launches, so their logits are bitwise equal.
  const int64_t vocab = model->config().vocab_size;
  for (int k = 0; k < 300; ++k) {
    Batch b;
    const int32_t on_source = feed[static_cast<size_t>(10 + k)], on_fork = feed[static_cast<size_t>(6 + k)];
    b.rows.push_back({{on_source}, &source, true, -1});
    b.rows.push_back({{on_fork}, &*fork, true, -1});
    b.rows.push_back({{on_fork}, &same, true, -1});
    b.rows.push_back({{on_source}, &source_same, true, -1});
    const std::vector<float> logits = model->forward(b).to_floats();
    ASSERT_EQ(static_cast<int64_t>(logits.size()), 4 * vocab);
    auto row = [&](int r) { return std::vector<float>(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab); };
    ASSERT_TRUE(row(1) == row(2)) << "step " << k << ": the fork differs from a cache that ran its tokens by up to "
                                  << max_abs_diff(row(1), row(2));
    ASSERT_TRUE(row(0) == row(3)) << "step " << k << ": the source changed under its fork by up to "
                                  << max_abs_diff(row(0), row(3));
  }
}

INSTANTIATE_TEST_SUITE_P(KvBits, CudaCacheFork, ::testing::Values(0, 8, 4),
                         [](const ::testing::TestParamInfo<int>& i) { return "kv" + std::to_string(i.param); });

// Requests over one kept system prompt, sent at once: each forks (copies) the kept cache, and each produces
// exactly the tokens it produces alone on a scheduler whose prompt cache holds the same prompt.
TEST(CudaSchedulerFork, ConcurrentRequestsShareAKeptPrompt) {
  LATHE_REQUIRE_GPU();
  ModelBundle bundle(test::model_dir("qwen3-q4g64"), LoadOptions{Device::CUDA, DType::BF16});
  std::vector<int32_t> system;
  for (int k = 0; k < 300; ++k) system.push_back(static_cast<int32_t>(5 + k * 11) % 590 + 3);
  struct Req {
    std::vector<int32_t> prompt;
    GenerateOptions opt;
  };
  std::vector<Req> reqs(6);
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].prompt = system;
    for (size_t k = 0; k < 3 + i; ++k) reqs[i].prompt.push_back(static_cast<int32_t>(20 + i * 37 + k * 5) % 580 + 5);
    reqs[i].opt.max_tokens = 16;
    reqs[i].opt.eos_ids = {-5};
  }
  auto primed = [&](Scheduler& s) {
    GenerateOptions o;
    o.max_tokens = 1;
    o.eos_ids = {-5};
    auto rec = std::make_shared<testutil::Recorder>();
    s.add(system, o, rec);
    while (!s.idle()) s.step();
    ASSERT_TRUE(rec->result);
  };
  SchedulerOptions opts;
  opts.kv_cache_bytes = int64_t{1} << 30;
  opts.max_batch = 8;
  // One token a row a step: every step runs at most 8 one-token rows, whose kernels are bitwise their solo runs
  // (longer prefill chunks of several rows take the M-row linears, equal to solo only within bf16 steps).
  opts.prefill_chunk = 1;
  // Alone: one request at a time, each served by a copy of the kept prompt (the kept cache stays).
  std::vector<std::vector<int32_t>> want;
  {
    Scheduler s(bundle, opts);
    primed(s);
    for (const Req& r : reqs) {
      auto rec = std::make_shared<testutil::Recorder>();
      s.add(r.prompt, r.opt, rec);
      while (!s.idle()) s.step();
      ASSERT_TRUE(rec->result);
      EXPECT_EQ(rec->result->cached_tokens, static_cast<int>(system.size()));
      want.push_back(rec->ids);
    }
  }
  Scheduler s(bundle, opts);
  primed(s);
  std::vector<std::shared_ptr<testutil::Recorder>> got;
  for (const Req& r : reqs) {
    got.push_back(std::make_shared<testutil::Recorder>());
    s.add(r.prompt, r.opt, got.back());
  }
  while (!s.idle()) s.step();
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i]->result) << i;
    EXPECT_EQ(got[i]->result->cached_tokens, static_cast<int>(system.size())) << "request " << i;
    EXPECT_EQ(got[i]->ids, want[i]) << "request " << i;
  }
}

}  // namespace
}  // namespace lathe
