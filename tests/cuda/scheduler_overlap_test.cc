// Step overlap (engine/scheduler.h): decode steps queued on the GPU before the last step's ids are read give each
// request exactly the tokens, logprobs and text of the synchronous scheduler (LATHE_STEP_OVERLAP=0): greedy and
// seeded sampled rows overlap (with a logit_bias too), a row with penalties keeps the step synchronous, rows that end
// at different lengths leave while a step that still holds them is in flight, and a finished row's kept cache (one
// token longer than without the overlap) serves a request that extends it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>

#include "cuda/cuda_test_util.h"
#include "engine/scheduler.h"
#include "support/fixtures.h"
#include "support/sequence_recorder.h"

namespace lathe {
namespace {

struct Req {
  std::vector<int32_t> prompt;
  GenerateOptions opt;
};

std::vector<Req> requests(int n, bool with_penalty) {
  std::vector<Req> out;
  for (int i = 0; i < n; ++i) {
    Req r;
    for (int k = 0; k < 6 + 5 * i; ++k) r.prompt.push_back(static_cast<int32_t>(11 + i * 29 + k * 13) % 590 + 3);
    r.opt.max_tokens = 10 + 4 * (i % 5);  // rows end at different steps, inside overlapped runs
    r.opt.eos_ids = {-5};
    if (i % 3 == 1) {
      r.opt.sampling.temperature = 0.8f;
      r.opt.sampling.top_p = 0.9f;
      r.opt.sampling.top_k = 50;
      r.opt.sampling.seed = 500 + i;
      r.opt.logprob = true;
    }
    if (i % 3 == 2) r.opt.logprob = true;  // greedy with its logprob: the sampling kernel
    if (i % 4 == 1) r.opt.sampling.logit_bias = {{5, -100.0f}, {9 + i, 2.5f}};  // no history: they overlap
    if (with_penalty && i == 3) r.opt.sampling.repetition_penalty = 1.2f;
    out.push_back(std::move(r));
  }
  return out;
}

struct Outcome {
  std::vector<std::shared_ptr<testutil::Recorder>> got;
  int64_t overlapped = 0;
  std::shared_ptr<testutil::Recorder> extension;
};

Outcome run_all(ModelBundle& bundle, const std::vector<Req>& reqs, bool overlap) {
  if (overlap)
    unsetenv("LATHE_STEP_OVERLAP");
  else
    setenv("LATHE_STEP_OVERLAP", "0", 1);
  SchedulerOptions o;
  o.max_batch = 16;
  o.max_batch_tokens = 512;
  o.kv_cache_bytes = int64_t{1} << 30;
  o.reuse_slots = 16;  // every finished request's cache stays (the extension below reuses request 0's)
  Scheduler s(bundle, o);
  unsetenv("LATHE_STEP_OVERLAP");
  Outcome r;
  for (const Req& q : reqs) {
    r.got.push_back(std::make_shared<testutil::Recorder>());
    s.add(q.prompt, q.opt, r.got.back());
  }
  for (int i = 0; i < 100000 && !s.idle(); ++i) s.step();
  r.overlapped = s.stats().overlapped_steps;
  // A request extending the first one's whole history (prompt + tokens): its kept cache serves it.
  Req ext = reqs[0];
  ext.prompt.insert(ext.prompt.end(), r.got[0]->ids.begin(), r.got[0]->ids.end());
  ext.prompt.push_back(77);
  ext.opt.max_tokens = 6;
  r.extension = std::make_shared<testutil::Recorder>();
  s.add(ext.prompt, ext.opt, r.extension);
  for (int i = 0; i < 1000 && !s.idle(); ++i) s.step();
  return r;
}

void expect_same(const Outcome& a, const Outcome& b) {
  ASSERT_EQ(a.got.size(), b.got.size());
  for (size_t i = 0; i < a.got.size(); ++i) {
    ASSERT_TRUE(a.got[i]->result && b.got[i]->result) << "request " << i;
    EXPECT_EQ(a.got[i]->ids, b.got[i]->ids) << "request " << i;
    EXPECT_EQ(a.got[i]->logprobs, b.got[i]->logprobs) << "request " << i;
    EXPECT_EQ(a.got[i]->text, b.got[i]->text) << "request " << i;
    EXPECT_EQ(a.got[i]->result->finish_reason, b.got[i]->result->finish_reason) << "request " << i;
  }
}

TEST(CudaSchedulerOverlap, OverlappedStepsGiveTheSynchronousOutputs) {
  LATHE_REQUIRE_GPU();
  ModelBundle bundle(test::model_dir("qwen3-q4g64"), LoadOptions{Device::CUDA, DType::BF16});
  std::vector<Req> reqs = requests(12, false);
  const Outcome sync = run_all(bundle, reqs, false), overlapped = run_all(bundle, reqs, true);
  EXPECT_EQ(sync.overlapped, 0);
  EXPECT_GT(overlapped.overlapped, 10) << "the decode steps after the graphs' capture overlap";
  expect_same(overlapped, sync);
  for (size_t i = 0; i < reqs.size(); ++i)
    EXPECT_EQ(overlapped.got[i]->ids.size(), static_cast<size_t>(reqs[i].opt.max_tokens)) << "request " << i;

  // Request 0 again, ending at a token of its own output (as EOS) well inside the overlapped steps: it ends while
  // the step after is in flight, which fed that token too, so its kept cache holds its whole history.
  const std::vector<int32_t>& greedy = sync.got[0]->ids;
  size_t at = 0;
  for (size_t k = 5; k < 9 && !at; ++k)
    if (std::find(greedy.begin(), greedy.begin() + static_cast<std::ptrdiff_t>(k), greedy[k]) ==
        greedy.begin() + static_cast<std::ptrdiff_t>(k))
      at = k;
  if (!at) GTEST_SKIP() << "no token of request 0's tokens 5-8 is new at its position";
  reqs[0].opt.eos_ids = {greedy[at]};
  const Outcome sync_eos = run_all(bundle, reqs, false), overlapped_eos = run_all(bundle, reqs, true);
  expect_same(overlapped_eos, sync_eos);
  ASSERT_EQ(overlapped_eos.got[0]->ids.size(), at + 1);
  EXPECT_EQ(overlapped_eos.got[0]->result->finish_reason, "stop");
  ASSERT_TRUE(overlapped_eos.extension->result && sync_eos.extension->result);
  const int history = static_cast<int>(reqs[0].prompt.size() + at + 1);
  EXPECT_EQ(overlapped_eos.extension->result->cached_tokens, history);
  EXPECT_EQ(sync_eos.extension->result->cached_tokens, history - 1);
  EXPECT_EQ(overlapped_eos.extension->ids.size(), 6u);
}

TEST(CudaSchedulerOverlap, ARowWithPenaltiesKeepsStepsSynchronous) {
  LATHE_REQUIRE_GPU();
  ModelBundle bundle(test::model_dir("qwen3-q4g64"), LoadOptions{Device::CUDA, DType::BF16});
  const std::vector<Req> reqs = requests(6, true);
  const Outcome sync = run_all(bundle, reqs, false), overlapped = run_all(bundle, reqs, true);
  expect_same(overlapped, sync);
  EXPECT_EQ(sync.overlapped, 0);
}

}  // namespace
}  // namespace lathe
