// The cost model behind cost-aware SSD restores: its decision is the comparison of the two estimates, it learns
// from real prefills and restores (ignoring ones too small to be rates), fixed policies ignore the rates, and
// the learned rates survive a restart through their file while a damaged file is ignored.
#include "cache/restore_cost.h"

#include <fstream>

#include <gtest/gtest.h>

#include "common/error.h"
#include "support/kv_test_util.h"

namespace lathe {
namespace {

RestoreCostOptions seeded(double tok_s, double mb_s) {
  RestoreCostOptions o;
  o.prefill_tok_s = tok_s;
  o.restore_mb_s = mb_s;
  return o;
}

TEST(RestoreCost, RestoresOnlyWhenReadingIsPredictedFaster) {
  // The H200 of session 11: 1.7 GB/s disk, 11.5k tok/s prefill at 16k (14.7k at 4k); a 16k bf16 prefix is 2.42 GB.
  const RestoreCostModel gpu(seeded(12500, 1700), Device::CUDA);
  const RestoreDecision d = gpu.decide(2'420'000'000, 16384);
  EXPECT_FALSE(d.restore);
  EXPECT_NEAR(d.restore_s, 2.42e9 / 1.7e9, 1e-6);
  EXPECT_NEAR(d.recompute_s, 16384 / 12500.0, 1e-6);
  // Near a tie it recomputes: predicted 10% faster is not enough, 30% is.
  EXPECT_FALSE(RestoreCostModel(seeded(1000, 1000), Device::CUDA).decide(1'000'000'000, 1100).restore);
  EXPECT_TRUE(RestoreCostModel(seeded(1000, 1000), Device::CUDA).decide(1'000'000'000, 1300).restore);
  // A 55 GB/s read of the same bytes wins.
  EXPECT_TRUE(RestoreCostModel(seeded(11500, 55000), Device::CUDA).decide(2'420'000'000, 16384).restore);
  // The CPU of this machine: 31 tok/s at 4k, 1 GB/s: restore.
  EXPECT_TRUE(RestoreCostModel(seeded(31, 1000), Device::CPU).decide(941'000'000, 4096).restore);
  // What it saves counts, not what the file holds: a RAM prefix leaving 16 tokens to compute is kept.
  EXPECT_FALSE(RestoreCostModel(seeded(31, 1000), Device::CPU).decide(941'000'000, 16).restore);
}

TEST(RestoreCost, DefaultSeedsLeanToRecomputeOnAGpuAndToRestoreOnTheCpu) {
  const RestoreCostModel gpu({}, Device::CUDA), cpu({}, Device::CPU);
  EXPECT_GT(gpu.prefill_tok_s(), cpu.prefill_tok_s());
  EXPECT_FALSE(gpu.decide(2'420'000'000, 16384).restore);
  EXPECT_TRUE(cpu.decide(941'000'000, 4096).restore);
}

TEST(RestoreCost, LearnsFromRealPrefillsAndRestores) {
  RestoreCostModel m(seeded(20000, 1000), Device::CUDA);
  // A slow engine: 4096 tokens in 100 s. The first measurement replaces the seed.
  m.observe_prefill(4096, 100);
  EXPECT_DOUBLE_EQ(m.prefill_tok_s(), 40.96);
  // Later ones are averaged, the newest weighing most: (0.7 * 4096 + 1024) / (0.7 * 100 + 10).
  m.observe_prefill(1024, 10);
  EXPECT_DOUBLE_EQ(m.prefill_tok_s(), (0.7 * 4096 + 1024) / (0.7 * 100 + 10));
  // A fast disk: 2 GB in 0.5 s.
  m.observe_restore(2'000'000'000, 0.5);
  EXPECT_DOUBLE_EQ(m.restore_mb_s(), 4000);
  // Too small to be rates (fixed costs): ignored.
  const double p = m.prefill_tok_s(), r = m.restore_mb_s();
  m.observe_prefill(8, 1000);
  m.observe_restore(1000, 1000);
  m.observe_prefill(4096, 0);
  EXPECT_EQ(m.prefill_tok_s(), p);
  EXPECT_EQ(m.restore_mb_s(), r);
  // learn = false keeps the seeds.
  RestoreCostOptions fixed = seeded(20000, 1000);
  fixed.learn = false;
  RestoreCostModel f(fixed, Device::CUDA);
  f.observe_prefill(4096, 100);
  EXPECT_DOUBLE_EQ(f.prefill_tok_s(), 20000);
}

TEST(RestoreCost, FixedPoliciesIgnoreTheRates) {
  RestoreCostOptions o = seeded(1e9, 0.001);
  o.policy = RestorePolicy::Always;
  EXPECT_TRUE(RestoreCostModel(o, Device::CPU).decide(1'000'000'000, 10).restore);
  o = seeded(1, 1e9);
  o.policy = RestorePolicy::Never;
  EXPECT_FALSE(RestoreCostModel(o, Device::CPU).decide(1, 100000).restore);
  EXPECT_EQ(parse_restore_policy("auto"), RestorePolicy::Auto);
  EXPECT_EQ(parse_restore_policy("never"), RestorePolicy::Never);
  EXPECT_THROW(parse_restore_policy("sometimes"), Error);
  EXPECT_THROW(RestoreCostModel(seeded(-1, 1), Device::CPU), Error);
}

TEST(RestoreCost, LearnedRatesSurviveARestartAndADamagedFileIsIgnored) {
  kvtest::TempDir dir;
  const std::string path = dir.path + "/restore_rates.json";
  RestoreCostModel a({}, Device::CUDA);
  a.observe_prefill(16384, 1.4);
  a.observe_restore(2'400'000'000, 1.5);
  a.save(path);
  RestoreCostModel b({}, Device::CUDA);
  b.load(path);
  EXPECT_DOUBLE_EQ(b.prefill_tok_s(), a.prefill_tok_s());
  EXPECT_DOUBLE_EQ(b.restore_mb_s(), a.restore_mb_s());
  // Only measurements are kept: a model that measured nothing leaves the next start on its own seeds.
  RestoreCostModel quiet(seeded(7, 7), Device::CPU);
  quiet.save(path);
  RestoreCostModel d({}, Device::CPU);
  d.load(path);
  EXPECT_DOUBLE_EQ(d.prefill_tok_s(), RestoreCostModel({}, Device::CPU).prefill_tok_s());
  for (const char* bad :
       {"{", "{\"prefill\":{\"tokens\":-1,\"seconds\":1},\"restore\":{\"bytes\":1,\"seconds\":1}}", "[1,2]"}) {
    std::ofstream(path) << bad;
    RestoreCostModel c({}, Device::CUDA);
    const double seed = c.prefill_tok_s();
    c.load(path);
    EXPECT_DOUBLE_EQ(c.prefill_tok_s(), seed) << bad;
  }
}

}  // namespace
}  // namespace lathe
