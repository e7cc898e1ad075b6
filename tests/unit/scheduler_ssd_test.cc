// The scheduler over the SSD tier: a kept cache written out (flush at shutdown, or on RAM eviction) serves a
// later scheduler's request that extends it — cached_tokens counts it and the tokens equal a cold run's; a file
// that fails to restore is a miss answered by prefill; salts never share entries, in RAM or on disk.
#include <filesystem>

#include <gtest/gtest.h>

#include "cache/cache_identity.h"
#include "engine/scheduler.h"
#include "support/fixtures.h"
#include "support/kv_test_util.h"
#include "support/sequence_recorder.h"

namespace lathe {
namespace {

namespace fs = std::filesystem;
using testutil::Recorder;

class SchedulerSsdTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { bundle_ = new ModelBundle(test::model_dir("qwen3-q4g64")); }
  static void TearDownTestSuite() { delete bundle_; }

  std::unique_ptr<SsdStore> store() { return kvtest::open_ssd_store(*bundle_, dir_.path); }
  static std::unique_ptr<Scheduler> scheduler(SsdStore* ssd, int reuse_slots = 4, RestoreCostOptions cost = {}) {
    SchedulerOptions o;
    o.kv_cache_bytes = 1 << 30;
    o.prefill_chunk = 32;
    o.reuse_slots = reuse_slots;
    auto s = std::make_unique<Scheduler>(*bundle_, o);
    SsdTierOptions t;
    t.restore = cost;
    t.write_behind_s = 1000;  // only explicit flushes and evictions write
    if (ssd) s->enable_ssd(*ssd, t);
    return s;
  }
  static std::shared_ptr<Recorder> run(Scheduler& s, const std::vector<int32_t>& prompt, const std::string& salt = "") {
    GenerateOptions opt;
    opt.max_tokens = 6;
    opt.eos_ids = {-5};
    opt.cache_salt = salt;
    auto rec = std::make_shared<Recorder>();
    s.add(prompt, opt, rec);
    for (int i = 0; i < 10000 && !s.idle(); ++i) s.step();
    EXPECT_TRUE(rec->result) << "the request finished";
    return rec;
  }
  static std::vector<int32_t> prompt(int n, int start) {
    std::vector<int32_t> v;
    for (int k = 0; k < n; ++k) v.push_back(static_cast<int32_t>(start + k * 7) % 600 + 1);
    return v;
  }
  static std::vector<int32_t> extend(std::vector<int32_t> p, const std::vector<int32_t>& more) {
    p.insert(p.end(), more.begin(), more.end());
    for (int k = 0; k < 9; ++k) p.push_back(40 + k);
    return p;
  }
  // A flushed cache of an n-token prompt's conversation serves the next scheduler with a cold run's tokens.
  void flushed_cache_serves_the_next_scheduler(int n);
  static ModelBundle* bundle_;
  kvtest::TempDir dir_;
};
ModelBundle* SchedulerSsdTest::bundle_ = nullptr;

void SchedulerSsdTest::flushed_cache_serves_the_next_scheduler(int n) {
  const std::vector<int32_t> first = prompt(n, 3);
  std::vector<int32_t> next;
  {
    auto st = store();
    auto s = scheduler(st.get());
    auto a = run(*s, first);
    next = extend(first, a->ids);
    s->flush_ssd();
    EXPECT_EQ(st->stats().entries, 1u);
  }
  auto st = store();  // a restart: a fresh index from the files
  ASSERT_EQ(st->stats().entries, 1u);
  auto s = scheduler(st.get());
  auto b = run(*s, next);
  EXPECT_EQ(b->result->cached_tokens, static_cast<int>(first.size() + 6 - 1));
  EXPECT_EQ(s->cache_stats().ssd_hits, 1);
  EXPECT_EQ(s->cache_stats().ram_hits, 0);
  auto cold = scheduler(nullptr);
  auto c = run(*cold, next);
  EXPECT_EQ(c->result->cached_tokens, 0);
  EXPECT_EQ(b->ids, c->ids);
}

TEST_F(SchedulerSsdTest, AFlushedCacheServesTheNextSchedulerWithTheColdTokens) {
  flushed_cache_serves_the_next_scheduler(70);
}

// With --kv-bits the caches are quantized triples in shared CPU blocks (1,024 tokens): a conversation longer
// than a block goes to a file and back the same way.
class SchedulerSsdQuantizedTest : public SchedulerSsdTest {
 protected:
  static void SetUpTestSuite() {
    CacheOptions c;
    c.kv_bits = 8;
    bundle_ = new ModelBundle(test::model_dir("qwen3-q4g64"), {}, c);
  }
};

TEST_F(SchedulerSsdQuantizedTest, AFlushedCacheServesTheNextSchedulerWithTheColdTokens) {
  flushed_cache_serves_the_next_scheduler(1100);
}

TEST_F(SchedulerSsdTest, RamEvictionSpillsAndAnotherSaltSeesNothing) {
  auto st = store();
  auto s = scheduler(st.get(), /*reuse_slots=*/1);
  const std::vector<int32_t> p1 = prompt(50, 11), p2 = prompt(40, 200);
  auto a = run(*s, p1, "alice");
  run(*s, p2, "alice");  // evicts p1's cache from RAM: it goes to the writer
  // Another salt: neither the RAM entry nor the file.
  auto other = run(*s, extend(p1, a->ids), "bob");
  EXPECT_EQ(other->result->cached_tokens, 0);
  s->flush_ssd();
  auto again = run(*s, extend(p1, a->ids), "alice");
  EXPECT_EQ(again->result->cached_tokens, static_cast<int>(p1.size() + 6 - 1));
  EXPECT_EQ(s->cache_stats().ssd_hits, 1);
}

TEST_F(SchedulerSsdTest, AFileThatFailsToRestoreIsAMissAnsweredByPrefill) {
  const std::vector<int32_t> first = prompt(60, 5);
  std::vector<int32_t> next;
  {
    auto st = store();
    auto s = scheduler(st.get());
    next = extend(first, run(*s, first)->ids);
    s->flush_ssd();
  }
  for (const auto& e : fs::recursive_directory_iterator(dir_.path))
    if (e.path().extension() == ".lkv") fs::resize_file(e.path(), fs::file_size(e.path()) / 2);  // truncated
  auto st = store();
  auto s = scheduler(st.get());
  auto b = run(*s, next);
  EXPECT_EQ(b->result->cached_tokens, 0);
  EXPECT_EQ(s->cache_stats().ssd_hits, 0);
  auto cold = scheduler(nullptr);
  EXPECT_EQ(b->ids, run(*cold, next)->ids);
}

// Cost-aware restore with injected rates (learning off): an engine predicted to prefill faster than the disk
// reads recomputes — no restore, counted as skipped, not as a miss, tokens as cold — and one predicted slower
// restores. The fixed policies ignore the rates.
TEST_F(SchedulerSsdTest, CostModelDecidesBetweenRestoreAndRecompute) {
  const std::vector<int32_t> first = prompt(70, 9);
  std::vector<int32_t> next;
  {
    auto st = store();
    auto s = scheduler(st.get());
    next = extend(first, run(*s, first)->ids);
    s->flush_ssd();
    EXPECT_TRUE(fs::exists(st->root() + "/restore_rates.json"));  // what it learned, for the next start
  }
  auto cold = scheduler(nullptr);
  const std::vector<int32_t> cold_ids = run(*cold, next)->ids;
  auto rates = [](double tok_s, double mb_s, RestorePolicy p = RestorePolicy::Auto) {
    RestoreCostOptions o;
    o.prefill_tok_s = tok_s;
    o.restore_mb_s = mb_s;
    o.learn = false;
    o.policy = p;
    return o;
  };
  struct Case {
    RestoreCostOptions cost;
    bool restores;
  };
  const Case cases[] = {{rates(1e9, 0.001), false},
                        {rates(1, 1e6), true},
                        {rates(1e9, 0.001, RestorePolicy::Always), true},
                        {rates(1, 1e6, RestorePolicy::Never), false}};
  for (const Case& c : cases) {
    auto st = store();
    auto s = scheduler(st.get(), 4, c.cost);
    auto b = run(*s, next);
    const CacheTierStats& cs = s->cache_stats();
    EXPECT_EQ(b->ids, cold_ids);
    EXPECT_EQ(cs.ssd_misses, 0);
    if (c.restores) {
      EXPECT_EQ(b->result->cached_tokens, static_cast<int>(first.size() + 6 - 1));
      EXPECT_EQ(cs.ssd_hits, 1);
      EXPECT_EQ(cs.ssd_skipped, 0);
    } else {
      EXPECT_EQ(b->result->cached_tokens, 0);
      EXPECT_EQ(cs.ssd_hits, 0);
      EXPECT_EQ(cs.ssd_skipped, 1);
      EXPECT_FALSE(cs.last_decision_restore);
    }
    if (c.cost.policy == RestorePolicy::Auto) {
      EXPECT_EQ(cs.last_decision_restore, c.restores);
      EXPECT_GT(cs.last_restore_est_s, 0);
      EXPECT_GT(cs.last_recompute_est_s, 0);
    }
    EXPECT_EQ(st->stats().entries, 1u);  // a skipped file stays for a later, costlier request
  }
}

// The prefill rate learns from real prefills: after a prompt the estimate moves from the seed towards what the
// engine did.
TEST_F(SchedulerSsdTest, PrefillRateLearnsFromRealPrefills) {
  auto st = store();
  RestoreCostOptions o;
  o.prefill_tok_s = 1e-3;  // absurdly slow seed
  auto s = scheduler(st.get(), 4, o);
  EXPECT_LT(s->cache_stats().prefill_tok_s, 1e-2);
  run(*s, prompt(200, 1));
  EXPECT_GT(s->cache_stats().prefill_tok_s, 1.0);
}

}  // namespace
}  // namespace lathe
