// Scheduler policy on a fixture model: batched rows produce exactly their solo tokens and logprobs (greedy and
// seeded sampling, rows joining mid-generation, rows preempted and resumed); admission waits for KV room;
// prompt chunks run beside decode tokens within the step's token budget; cancelled rows leave at the next
// step; a prompt larger than the whole budget is refused; a request extending a finished one reuses its cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>

#include "cache/kv_block_pool.h"
#include "engine/scheduler.h"
#include "support/fixtures.h"
#include "support/sequence_recorder.h"

namespace lathe {
namespace {

using testutil::Recorder;

struct Req {
  std::vector<int32_t> prompt;
  GenerateOptions opt;
};

class SchedulerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { bundle_ = new ModelBundle(test::model_dir("qwen3-q4g64")); }
  static void TearDownTestSuite() { delete bundle_; }

  // Distinct first tokens keep prefix reuse out of the comparisons (it changes chunk boundaries).
  static std::vector<Req> requests(int n) {
    std::vector<Req> out;
    for (int i = 0; i < n; ++i) {
      Req r;
      for (int k = 0; k < 5 + 7 * i; ++k) r.prompt.push_back(static_cast<int32_t>(10 + i * 31 + k * 7) % 600);
      r.opt.max_tokens = 12 + 3 * (i % 4);
      if (i % 2) {
        r.opt.sampling.temperature = 0.9f;
        r.opt.sampling.top_k = 40;
        r.opt.sampling.seed = 1000 + i;
      }
      if (i % 3 == 2) r.opt.sampling.repetition_penalty = 1.3f;
      r.opt.eos_ids = {-5};  // never: lengths stay fixed
      out.push_back(std::move(r));
    }
    return out;
  }
  // A system prompt of `tokens` ids ((first + k·step) mod `mod` + 3), and requests that each start with it.
  static std::vector<int32_t> system_prompt(int tokens, int first, int step, int mod) {
    std::vector<int32_t> system;
    for (int k = 0; k < tokens; ++k) system.push_back(static_cast<int32_t>(first + k * step) % mod + 3);
    return system;
  }
  static std::vector<Req> after(const std::vector<int32_t>& system, std::vector<Req> reqs) {
    for (Req& r : reqs) r.prompt.insert(r.prompt.begin(), system.begin(), system.end());
    return reqs;
  }
  static void run(Scheduler& s, int max_steps = 100000) {
    for (int i = 0; i < max_steps && !s.idle(); ++i) s.step();
  }
  // The request alone on a scheduler with the same chunking (chunk boundaries are part of a server's setup).
  static std::shared_ptr<Recorder> solo(const Req& r, int prefill_chunk = 256) {
    SchedulerOptions o;
    o.max_batch = 1;
    o.prefill_chunk = prefill_chunk;
    o.kv_cache_bytes = 1 << 30;
    Scheduler s(*bundle_, o);
    auto rec = std::make_shared<Recorder>();
    s.add(r.prompt, r.opt, rec);
    run(s);
    return rec;
  }
  // A batching setup: rows, tokens a step, prefill chunk, and a KV budget of `budget_tokens` tokens.
  static SchedulerOptions batched(int max_batch, int max_batch_tokens, int prefill_chunk, int64_t budget_tokens) {
    SchedulerOptions o;
    o.max_batch = max_batch;
    o.max_batch_tokens = max_batch_tokens;
    o.prefill_chunk = prefill_chunk;
    o.kv_cache_bytes = KvBudget(bundle_->model().config(), bundle_->cache_options()).bytes_for(budget_tokens);
    return o;
  }
  // Every batched request produced exactly its solo tokens, logprobs (bit-exact: the same forwards) and text.
  static void expect_solo_outputs(const std::vector<std::shared_ptr<Recorder>>& got,
                                  const std::vector<std::shared_ptr<Recorder>>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(got[i]->result) << i;
      EXPECT_EQ(got[i]->ids, want[i]->ids) << "request " << i;
      EXPECT_EQ(got[i]->logprobs, want[i]->logprobs) << "request " << i;
      EXPECT_EQ(got[i]->text, want[i]->text) << i;
      EXPECT_EQ(got[i]->result->finish_reason, "length");
    }
  }
  static ModelBundle* bundle_;
};
ModelBundle* SchedulerTest::bundle_ = nullptr;

TEST_F(SchedulerTest, BatchedRowsEqualSoloIncludingLateJoinersAndPreemption) {
  const auto reqs = requests(8);
  std::vector<std::shared_ptr<Recorder>> want;
  for (const Req& r : reqs) want.push_back(solo(r, 6));

  // Room for about three rows: rows wait for admission and running rows get preempted as they grow.
  Scheduler s(*bundle_, batched(8, 24, 6, 150));
  std::vector<std::shared_ptr<Recorder>> got;
  for (size_t i = 0; i < reqs.size(); ++i) {
    got.push_back(std::make_shared<Recorder>());
    s.add(reqs[i].prompt, reqs[i].opt, got.back());
    if (i % 2) s.step();  // later requests arrive while earlier ones generate
  }
  run(s);
  EXPECT_GT(s.stats().preemptions, 0);
  expect_solo_outputs(got, want);
}

TEST_F(SchedulerTest, RequestThatDoesNotFitWaitsForRoom) {
  const auto reqs = requests(4);
  SchedulerOptions o;
  o.max_batch = 4;
  o.kv_cache_bytes = KvBudget(bundle_->model().config(), {}).bytes_for(50);  // one row at a time
  o.reuse_slots = 0;
  Scheduler s(*bundle_, o);
  auto a = std::make_shared<Recorder>(), b = std::make_shared<Recorder>();
  s.add(reqs[3].prompt, reqs[3].opt, a);  // 26 prompt + 21 tokens
  s.add(reqs[3].prompt, reqs[3].opt, b);
  s.step();
  EXPECT_EQ(s.stats().running, 1);
  EXPECT_EQ(s.stats().waiting, 1);
  while (!a->done()) s.step();
  EXPECT_TRUE(b->ids.empty());  // never ran beside a
  run(s);
  EXPECT_EQ(b->ids, a->ids);
}

TEST_F(SchedulerTest, PromptChunksRunBesideDecodeTokens) {
  SchedulerOptions o;
  o.max_batch = 4;
  o.max_batch_tokens = 10;
  o.prefill_chunk = 100;  // clamped to 10 - 3 = 7 so it fits beside three decode tokens
  o.kv_cache_bytes = 1 << 30;
  Scheduler s(*bundle_, o);
  auto dec = std::make_shared<Recorder>(), longp = std::make_shared<Recorder>();
  Req d = requests(1)[0];
  d.opt.max_tokens = 40;
  s.add(d.prompt, d.opt, dec);
  s.step();  // dec's prompt (5 tokens) and its first token
  ASSERT_EQ(dec->ids.size(), 1u);
  Req l;
  for (int k = 0; k < 60; ++k) l.prompt.push_back(300 + k);
  l.opt.max_tokens = 2;
  s.add(l.prompt, l.opt, longp);
  int steps = 0;
  while (longp->ids.empty()) {
    const size_t before = dec->ids.size();
    s.step();
    ++steps;
    EXPECT_EQ(dec->ids.size(), before + 1) << "the decoding row got no token in step " << steps;
    EXPECT_LE(s.stats().batch_tokens, 10);
  }
  EXPECT_EQ(steps, 9);  // ceil(60 / 7) prompt chunks, the last one sampling
  run(s);
}

TEST_F(SchedulerTest, CancelledRowsLeaveAtTheNextStep) {
  SchedulerOptions o;
  o.max_batch = 1;
  o.kv_cache_bytes = 1 << 30;
  Scheduler s(*bundle_, o);
  auto reqs = requests(2);
  std::atomic<bool> cancel_a{false}, cancel_b{false};
  reqs[0].opt.max_tokens = 100;
  reqs[0].opt.cancel = &cancel_a;
  reqs[1].opt.cancel = &cancel_b;
  auto a = std::make_shared<Recorder>(), b = std::make_shared<Recorder>();
  s.add(reqs[0].prompt, reqs[0].opt, a);
  s.add(reqs[1].prompt, reqs[1].opt, b);  // queued behind a (one row)
  s.step();
  s.step();
  cancel_b = true;
  s.step();
  ASSERT_TRUE(b->result);
  EXPECT_EQ(b->result->finish_reason, "cancelled");
  EXPECT_TRUE(b->ids.empty());
  const size_t n = a->ids.size();
  cancel_a = true;
  s.step();
  ASSERT_TRUE(a->result);
  EXPECT_EQ(a->result->finish_reason, "cancelled");
  EXPECT_EQ(a->ids.size(), n);
  EXPECT_TRUE(s.idle());
}

TEST_F(SchedulerTest, PromptLargerThanTheBudgetIsRefused) {
  SchedulerOptions o;
  o.kv_cache_bytes = KvBudget(bundle_->model().config(), {}).bytes_for(8);
  Scheduler s(*bundle_, o);
  auto r = std::make_shared<Recorder>();
  s.add(requests(3)[2].prompt, {}, r);  // 19 tokens
  ASSERT_TRUE(r->error);
  EXPECT_THROW(std::rethrow_exception(r->error), Error);
  EXPECT_TRUE(s.idle());
  auto empty = std::make_shared<Recorder>();
  s.add({}, {}, empty);
  EXPECT_TRUE(empty->error);
}

TEST_F(SchedulerTest, FinishedSequenceCacheServesARequestThatExtendsIt) {
  SchedulerOptions o;
  o.kv_cache_bytes = 1 << 30;
  Scheduler s(*bundle_, o);
  Req first = requests(3)[2];
  auto a = std::make_shared<Recorder>();
  s.add(first.prompt, first.opt, a);
  run(s);
  Req next;
  next.prompt = first.prompt;
  next.prompt.insert(next.prompt.end(), a->ids.begin(), a->ids.end());
  for (int k = 0; k < 6; ++k) next.prompt.push_back(50 + k);
  next.opt.max_tokens = 10;
  auto b = std::make_shared<Recorder>();
  s.add(next.prompt, next.opt, b);
  run(s);
  ASSERT_TRUE(b->result);
  // Everything the first sequence fed: its prompt and all its tokens but the last.
  EXPECT_EQ(b->result->cached_tokens, static_cast<int>(first.prompt.size() + a->ids.size() - 1));
  EXPECT_EQ(b->ids, solo(next)->ids);
}

// With --kv-bits 8 the caches are quantized rows in shared CPU blocks. Requests over two long system prompts
// (more than one 1,024-token block) fork kept and running rows' blocks, copy the shared blocks they write into,
// wait for room, get preempted and resumed, and each still produces exactly its solo, cold tokens and logprobs.
class QuantizedSchedulerTest : public SchedulerTest {
 protected:
  static void SetUpTestSuite() {
    CacheOptions c;
    c.kv_bits = 8;
    bundle_ = new ModelBundle(test::model_dir("qwen3-q4g64"), {}, c);
  }
};

TEST_F(QuantizedSchedulerTest, SharedPrefixRowsEqualSoloIncludingLateJoinersAndPreemption) {
  std::vector<int32_t> systems[2];
  for (int k = 0; k < 1100; ++k) systems[0].push_back(static_cast<int32_t>(5 + k * 11) % 590 + 3);
  for (int k = 0; k < 700; ++k) systems[1].push_back(static_cast<int32_t>(9 + k * 17) % 590 + 3);
  std::vector<Req> reqs = requests(8);
  for (size_t i = 0; i < reqs.size(); ++i) {
    std::vector<int32_t> p = systems[i % 2];
    p.insert(p.end(), reqs[i].prompt.begin(), reqs[i].prompt.end());
    reqs[i].prompt = std::move(p);
  }
  std::vector<std::shared_ptr<Recorder>> want;
  for (const Req& r : reqs) want.push_back(solo(r, 64));

  const KvPoolStats base = kv_pool_stats();
  {
    // Room for the first three prompts (1,105 + 712 + 1,119 tokens) and little more: later rows wait, and the
    // running ones, growing, preempt the newest.
    Scheduler s(*bundle_, batched(8, 160, 64, 2950));
    std::vector<std::shared_ptr<Recorder>> got;
    int64_t most_refs = 0;  // the most block mappings beyond one per block seen after a step
    auto step = [&] {
      s.step();
      const KvPoolStats now = kv_pool_stats();
      most_refs = std::max(most_refs, (now.references - base.references) - (now.blocks - base.blocks));
    };
    for (size_t i = 0; i < reqs.size(); ++i) {
      got.push_back(std::make_shared<Recorder>());
      s.add(reqs[i].prompt, reqs[i].opt, got.back());
      for (int k = 0; k < 12; ++k) step();  // later requests arrive while earlier ones prefill and generate
    }
    while (!s.idle()) step();
    EXPECT_GT(s.stats().preemptions, 0);
    EXPECT_GT(s.cache_stats().ram_hits, 0);
    EXPECT_GT(most_refs, 0) << "no block was ever mapped by two caches at once";
    expect_solo_outputs(got, want);
  }
  EXPECT_EQ(kv_pool_stats().blocks, base.blocks);
}

// A burst of requests over one system prompt nobody has sent before: the first prefills it, the others wait
// for that (FIFO) and fork it, so it is prefilled once; each still produces exactly its solo, cold tokens.
TEST_F(SchedulerTest, BurstOverANewPromptPrefillsItOnce) {
  const std::vector<int32_t> system = system_prompt(300, 5, 11, 590);
  std::vector<Req> reqs = after(system, requests(4));
  std::vector<std::shared_ptr<Recorder>> want;
  for (const Req& r : reqs) want.push_back(solo(r, 64));
  Scheduler s(*bundle_, batched(4, 160, 64, 4096));
  std::vector<std::shared_ptr<Recorder>> got;
  for (const Req& r : reqs) {
    got.push_back(std::make_shared<Recorder>());
    s.add(r.prompt, r.opt, got.back());
  }
  run(s);
  EXPECT_EQ(got[0]->result->cached_tokens, 0);
  for (size_t i = 1; i < got.size(); ++i) {
    ASSERT_TRUE(got[i]->result);
    EXPECT_EQ(got[i]->result->cached_tokens, static_cast<int>(system.size())) << "request " << i;
  }
  EXPECT_GT(s.stats().prefix_waits, 0);
  EXPECT_EQ(s.cache_stats().ram_hits, 3);
  expect_solo_outputs(got, want);
}

// A request waiting for a donor's prefill goes ahead when the donor is cancelled, and prefills the prompt itself.
TEST_F(SchedulerTest, ARequestWaitingForACancelledDonorGoesAhead) {
  const std::vector<int32_t> system = system_prompt(300, 5, 11, 590);
  std::vector<Req> reqs = after(system, requests(2));
  std::atomic<bool> cancel{false};
  reqs[0].opt.cancel = &cancel;
  Scheduler s(*bundle_, batched(4, 160, 64, 4096));
  auto a = std::make_shared<Recorder>(), b = std::make_shared<Recorder>();
  s.add(reqs[0].prompt, reqs[0].opt, a);
  s.add(reqs[1].prompt, reqs[1].opt, b);
  s.step();
  s.step();
  EXPECT_EQ(s.stats().running, 1);  // b waits for a's prefill of the shared prompt
  EXPECT_GT(s.stats().prefix_waits, 0);
  cancel = true;
  run(s);
  ASSERT_TRUE(a->result);
  EXPECT_EQ(a->result->finish_reason, "cancelled");
  ASSERT_TRUE(b->result);
  EXPECT_EQ(b->result->finish_reason, "length");
  EXPECT_EQ(b->ids, solo(reqs[1], 64)->ids);
}

// Gemma 4's sliding-window layers keep rings of 8 tokens, which cannot share blocks: a kept cache of a system
// prompt is forked into every request that extends it by copying its rings (its full-attention layers map the
// kept blocks). So concurrent requests all hit it, it stays for the next ones, and each still produces exactly
// its solo, cold tokens and logprobs.
class RingSchedulerTest : public SchedulerTest {
 protected:
  static void SetUpTestSuite() { bundle_ = new ModelBundle(test::model_dir("gemma4-bf16")); }
};

TEST_F(RingSchedulerTest, KeptSystemPromptServesEveryConcurrentRequest) {
  const std::vector<int32_t> system = system_prompt(40, 7, 13, 800);
  const std::vector<Req> reqs = after(system, requests(4));
  std::vector<std::shared_ptr<Recorder>> want;
  for (const Req& r : reqs) want.push_back(solo(r, 16));

  SchedulerOptions o = batched(4, 64, 16, 4096);
  o.reuse_slots = 8;  // room for the four finished sequences beside the kept prompt
  Scheduler s(*bundle_, o);
  Req prime;
  prime.prompt = system;
  prime.opt.max_tokens = 1;
  prime.opt.eos_ids = {-5};
  auto primed = std::make_shared<Recorder>();
  s.add(prime.prompt, prime.opt, primed);
  run(s);
  ASSERT_TRUE(primed->result);
  for (int round = 0; round < 2; ++round) {  // the kept prompt stays for the next burst too
    std::vector<std::shared_ptr<Recorder>> got;
    for (const Req& r : reqs) {
      got.push_back(std::make_shared<Recorder>());
      s.add(r.prompt, r.opt, got.back());
    }
    run(s);
    for (const auto& g : got) {
      ASSERT_TRUE(g->result);
      EXPECT_EQ(g->result->cached_tokens, static_cast<int>(system.size())) << "round " << round;
    }
    expect_solo_outputs(got, want);
  }
  EXPECT_EQ(s.cache_stats().ram_hits, 8);
}

TEST(KvBudget, CountsFullLayersPerTokenAndWindowsUpToTheirSize) {
  ModelConfig c;
  c.num_layers = 3;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.layer_types = {"full_attention", "sliding_attention", "linear_attention"};
  c.sliding_window = 10;
  const int64_t f32 = 2 * 2 * 16 * 4;  // K and V, 2 heads of 16, f32
  const KvBudget plain(c, {});
  EXPECT_EQ(plain.bytes_per_token(), f32);
  EXPECT_EQ(plain.bytes_for(4), 2 * 4 * f32);             // full + window, both under 10
  EXPECT_EQ(plain.bytes_for(100), 100 * f32 + 10 * f32);  // the window stops growing; the SSM layer is fixed
  CacheOptions q8;
  q8.kv_bits = 8;
  q8.kv_group_size = 32;
  // 64 values a token: 64 one-byte codes plus a scale and a bias per 32 values.
  EXPECT_EQ(KvBudget(c, q8).bytes_per_token(), 64 + 2 * 2 * 4);
}

}  // namespace
}  // namespace lathe
