// Sampler and logits processors: the documented properties, not just "runs".
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>

#include "common/error.h"
#include "engine/logits_processors.h"
#include "engine/sampler.h"
#include "engine/stop_matcher.h"
#include "tensor/ops.h"

namespace lathe {
namespace {

const std::vector<float> kLogits = {1.0f, 3.0f, 2.5f, -1.0f, 0.5f, 2.9f, -3.0f, 0.0f};

std::vector<float> log_probs(std::vector<float> x) {
  float mx = *std::max_element(x.begin(), x.end());
  double s = 0;
  for (float v : x) s += std::exp(v - mx);
  for (float& v : x) v = v - mx - static_cast<float>(std::log(s));
  return x;
}

std::vector<int32_t> draw(SamplingParams p, int n, const std::vector<float>& logits = kLogits) {
  Sampler s(p);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) out.push_back(s.sample(logits, {}).token);
  return out;
}

TEST(Sampler, TemperatureZeroIsArgmax) {
  for (int32_t t : draw({}, 5)) EXPECT_EQ(t, 1);
}

// Greedy without logprobs takes the argmax without a log-softmax when that is exact; it must pick what the full
// path (log-softmax, then the first maximum) picks: near-ties within the margin before or after the maximum,
// exact duplicates, NaN, infinities, and lengths around the 16-lane blocks.
TEST(Sampler, GreedyFastPathPicksTheFullPathsToken) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 3.f);
  int cases = 0;
  for (size_t n : {1u, 2u, 15u, 16u, 17u, 31u, 33u, 1000u, 151936u})
    for (int variant = 0; variant < 9; ++variant) {
      std::vector<float> x(n);
      for (float& v : x) v = nd(rng);
      const size_t top = static_cast<size_t>(std::max_element(x.begin(), x.end()) - x.begin());
      const size_t other = rng() % n;
      const float m = x[top];
      switch (variant) {
        case 1: x[other] = m - 5e-5f; break;  // within the tie margin
        case 2: x[other] = m; break;          // an exact duplicate
        case 3: x[other] = m - 2e-4f; break;  // just outside the margin
        case 4: x[other] = std::nanf(""); break;
        case 5: x[other] = std::numeric_limits<float>::infinity(); break;
        case 6: std::fill(x.begin(), x.end(), -std::numeric_limits<float>::infinity()), x[other] = 1.f; break;
        case 7: x[n - 1] = m + 1e-5f; break;  // the last entry edges past an earlier maximum
        case 8: x[0] = m - 1e-5f, x[n - 1] = m; break;
        default: break;
      }
      Sampler fast(SamplingParams{}), full(SamplingParams{});
      EXPECT_EQ(fast.sample(x, {}, 0, false).token, full.sample(x, {}, 0, true).token)
          << "n " << n << " variant " << variant;
      ++cases;
    }
  EXPECT_EQ(cases, 81);
}

// argmax_rows (greedy decode in `lathe run`, the device sampler's CPU fallback) scans 16 floats at a time; it must
// give max_element's answer: the first maximum, and max_element's own one for a row with NaN.
TEST(ArgmaxRows, EqualsMaxElement) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 2.f);
  for (int64_t n : {1, 15, 16, 17, 40, 151936})
    for (int variant = 0; variant < 6; ++variant) {
      std::vector<float> x(static_cast<size_t>(2 * n));
      for (float& v : x) v = nd(rng);
      const size_t at = rng() % static_cast<size_t>(n);
      if (variant == 1) x[at] = x[n - 1 - static_cast<int64_t>(at) + n] = 50.f;  // a duplicated maximum
      if (variant == 2) x[at] = std::nanf("");
      if (variant == 3) x[at] = std::numeric_limits<float>::infinity();
      if (variant == 4) std::fill(x.begin(), x.begin() + n, -std::numeric_limits<float>::infinity());
      if (variant == 5) x[static_cast<size_t>(n) + at] = -0.f, x[at] = 0.f;
      const std::vector<int32_t> got = argmax_rows(Tensor::from_floats(x, {2, n}));
      for (int64_t r = 0; r < 2; ++r) {
        const float* row = x.data() + r * n;
        EXPECT_EQ(got[static_cast<size_t>(r)], std::max_element(row, row + n) - row)
            << "n " << n << " variant " << variant << " row " << r;
      }
    }
}

TEST(Sampler, TopKOneIsGreedyAtAnyTemperature) {
  SamplingParams p;
  p.temperature = 5.0f;
  p.top_k = 1;
  p.seed = 3;
  for (int32_t t : draw(p, 50)) EXPECT_EQ(t, 1);
}

TEST(Sampler, SameSeedSameTokensDifferentSeedDifferentDraws) {
  SamplingParams p;
  p.temperature = 1.5f;
  p.seed = 42;
  const auto a = draw(p, 64), b = draw(p, 64);
  EXPECT_EQ(a, b);
  p.seed = 43;
  EXPECT_NE(a, draw(p, 64));
}

TEST(Sampler, DrawFrequenciesFollowTheDistribution) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 7;
  Sampler s(p);
  std::map<int32_t, int> count;
  const int n = 20000;
  for (int i = 0; i < n; ++i) ++count[s.sample(kLogits, {}).token];
  const auto lp = log_probs(kLogits);
  for (size_t i = 0; i < kLogits.size(); ++i)
    EXPECT_NEAR(count[static_cast<int32_t>(i)] / static_cast<double>(n), std::exp(lp[i]), 0.015) << "token " << i;
}

TEST(Filters, TopPKeepsSmallestSetWithEnoughMass) {
  auto lp = log_probs(kLogits);
  const auto orig = lp;
  filter_top_p(lp, 0.6f);
  // Sorted probabilities: token 1, 5, 2, ... ; keep the shortest prefix with cumulative mass ≥ 0.6.
  std::vector<size_t> order = {1, 5, 2, 0, 4, 7, 3, 6};
  double mass = 0;
  size_t needed = 0;
  while (mass < 0.6) mass += std::exp(orig[order[needed++]]);
  for (size_t r = 0; r < order.size(); ++r) EXPECT_EQ(std::isinf(lp[order[r]]), r >= needed) << "rank " << r;
}

// The definitions the fast filters replaced: a stable descending sort of the whole vocabulary each time.
namespace reference {
std::vector<size_t> order_desc(const std::vector<float>& x) {
  std::vector<size_t> idx(x.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return x[a] > x[b]; });
  return idx;
}
void top_p(std::vector<float>& lp, float p) {
  double mass = 0;
  bool reached = false;
  for (size_t i : order_desc(lp)) {
    if (reached) {
      lp[i] = -INFINITY;
      continue;
    }
    mass += std::exp(static_cast<double>(lp[i]));
    if (mass >= p) reached = true;
  }
}
void top_k(std::vector<float>& lp, int k) {
  const auto idx = order_desc(lp);
  for (size_t r = static_cast<size_t>(k); r < idx.size(); ++r) lp[idx[r]] = -INFINITY;
}
}  // namespace reference

// Peaked and flat distributions over a real-sized vocabulary, with ties (values rounded to a coarse grid) and
// entries already -inf: the fast top-p / top-k keep exactly the reference's set, and sampling draws alike.
TEST(Filters, FastTopPAndTopKEqualTheFullSortDefinition) {
  uint64_t state = 12345;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<double>(state >> 11) * 0x1.0p-53;
  };
  for (const float spread : {0.05f, 1.0f, 4.0f, 12.0f})
    for (const bool coarse : {false, true}) {
      std::vector<float> logits(20000);
      for (size_t i = 0; i < logits.size(); ++i) {
        float v = static_cast<float>((next() - 0.5) * 2 * spread + (i % 997 == 0 ? 3 * spread : 0));
        if (coarse) v = std::round(v * 4) / 4;  // many exact ties
        logits[i] = i % 50 == 7 ? -INFINITY : v;
      }
      const auto lp = log_probs(logits);
      for (const float p : {0.1f, 0.5f, 0.9f, 0.95f, 0.999f}) {
        auto fast = lp, slow = lp;
        filter_top_p(fast, p);
        reference::top_p(slow, p);
        EXPECT_EQ(fast, slow) << "top_p " << p << " spread " << spread << " coarse " << coarse;
      }
      for (const int k : {1, 5, 40, 5000, 19999}) {
        auto fast = lp, slow = lp;
        filter_top_k(fast, k);
        reference::top_k(slow, k);
        EXPECT_EQ(fast, slow) << "top_k " << k << " spread " << spread << " coarse " << coarse;
        auto after_p = lp;  // top_k after top_p: most entries -inf already
        filter_top_p(after_p, 0.5f);
        auto ref_after_p = after_p;
        filter_top_k(after_p, k);
        reference::top_k(ref_after_p, k);
        EXPECT_EQ(after_p, ref_after_p) << "top_k " << k << " after top_p";
      }
    }
}

TEST(Filters, MinPThresholdIsRelativeToTheTopToken) {
  auto lp = log_probs(kLogits);
  const auto orig = lp;
  filter_min_p(lp, 0.2f);
  const double pmax = std::exp(orig[1]);
  for (size_t i = 0; i < lp.size(); ++i) EXPECT_EQ(std::isinf(lp[i]), std::exp(orig[i]) < 0.2 * pmax) << i;
}

TEST(Filters, TopKKeepsKLargest) {
  auto lp = log_probs(kLogits);
  filter_top_k(lp, 3);
  std::set<size_t> kept;
  for (size_t i = 0; i < lp.size(); ++i)
    if (!std::isinf(lp[i])) kept.insert(i);
  EXPECT_EQ(kept, (std::set<size_t>{1, 2, 5}));
}

TEST(Filters, XtcRemovesAllButTheLeastLikelyAboveThreshold) {
  auto lp = log_probs(kLogits);  // tokens 1, 5, 2 are each above 0.15
  filter_xtc(lp, 0.15f, {});
  EXPECT_TRUE(std::isinf(lp[1]));
  EXPECT_TRUE(std::isinf(lp[5]));
  EXPECT_FALSE(std::isinf(lp[2]));
  auto exempt = log_probs(kLogits);
  const std::vector<int32_t> ex = {1};
  filter_xtc(exempt, 0.15f, ex);
  EXPECT_FALSE(std::isinf(exempt[1]));
}

TEST(Processors, PenaltyFormulas) {
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  std::vector<float> l = {4.0f, -4.0f, 1.0f};
  const std::vector<int32_t> hist = {0, 1, 1};
  apply_logits_processors(l, p, hist);
  EXPECT_FLOAT_EQ(l[0], 2.0f);   // positive: divided
  EXPECT_FLOAT_EQ(l[1], -8.0f);  // negative: multiplied, once per distinct token
  EXPECT_FLOAT_EQ(l[2], 1.0f);

  SamplingParams q;
  q.presence_penalty = 0.5f;
  q.frequency_penalty = 0.25f;
  std::vector<float> m = {0.0f, 0.0f, 0.0f};
  apply_logits_processors(m, q, hist);
  EXPECT_FLOAT_EQ(m[0], -0.5f - 0.25f);
  EXPECT_FLOAT_EQ(m[1], -0.5f - 0.5f);
  EXPECT_FLOAT_EQ(m[2], 0.0f);

  SamplingParams w;  // the window only sees the last N tokens
  w.frequency_penalty = 1.0f;
  w.frequency_context_size = 1;
  std::vector<float> n = {0.0f, 0.0f};
  apply_logits_processors(n, w, hist);
  EXPECT_FLOAT_EQ(n[0], 0.0f);
  EXPECT_FLOAT_EQ(n[1], -1.0f);
}

// The device sampler's path: one step's edits at flat indices of [rows, vocab] change each row exactly as the
// host processors change that row alone.
TEST(Processors, StepEditsEqualPerRowProcessors) {
  SamplingParams a, b;
  a.logit_bias = {{2, -1.5f}, {0, 0.25f}};
  a.repetition_penalty = 1.7f;
  b.presence_penalty = 0.3f;
  b.frequency_penalty = 0.45f;
  b.logit_bias = {{4, 2.0f}};
  const std::vector<int32_t> hist = {1, 3, 3, 4, 9, 3};  // 9 is outside a 5-token vocabulary: ignored
  const std::vector<float> rows = {0.5f, -2.0f, 1.25f, 3.0f, -0.0f, -1.0f, 0.75f, 2.5f, -3.5f, 0.1f};
  Tensor step = Tensor::from_floats(rows, {2, 5});
  std::vector<LogitEdit> edits = logit_edits(a, hist, 5, 0);
  const std::vector<LogitEdit> second = logit_edits(b, hist, 5, 5);
  edits.insert(edits.end(), second.begin(), second.end());
  apply_logit_edits(step, edits);
  std::vector<float> ra(rows.begin(), rows.begin() + 5), rb(rows.begin() + 5, rows.end());
  apply_logits_processors(ra, a, hist);
  apply_logits_processors(rb, b, hist);
  ra.insert(ra.end(), rb.begin(), rb.end());
  EXPECT_EQ(step.to_floats(), ra);
  EXPECT_FLOAT_EQ(ra[5 + 3], -3.5f - 0.3f - 0.45f * 3);  // presence once, frequency per occurrence
}

TEST(Processors, LogitBiasCanForceAToken) {
  SamplingParams p;
  p.logit_bias[6] = 100.0f;
  EXPECT_EQ(draw(p, 1)[0], 6);
}

TEST(Sampler, LogprobsAreTakenAfterProcessorsBeforeFilters) {
  SamplingParams p;
  p.logit_bias[0] = 10.0f;
  p.temperature = 0.7f;
  p.top_k = 1;
  p.seed = 1;
  Sampler s(p);
  std::vector<float> biased = kLogits;
  biased[0] += 10.0f;
  const auto lp = log_probs(biased);
  const SampleResult r = s.sample(kLogits, {}, 3);
  EXPECT_EQ(r.token, 0);
  EXPECT_NEAR(r.logprob, lp[0], 1e-5);
  ASSERT_EQ(r.top.size(), 3u);
  EXPECT_EQ(r.top[0].id, 0);
  EXPECT_EQ(r.top[1].id, 1);
  EXPECT_NEAR(r.top[1].logprob, lp[1], 1e-5);
}

TEST(Sampler, InvalidParamsNameTheField) {
  SamplingParams p;
  p.top_p = 1.5f;
  try {
    Sampler s(p);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("top_p"), std::string::npos);
  }
  SamplingParams t;
  t.temperature = -1;
  EXPECT_THROW(Sampler{t}, Error);
}

TEST(StopMatcher, CatchesStopsSplitAcrossTokensAndExcludesThem) {
  StopMatcher m({"</end>", "STOP"});
  std::string out;
  for (const char* piece : {"Hello <", "/e", "nd> tail"}) out += m.push(piece);
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "</end>");
  EXPECT_EQ(out, "Hello ");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, ReleasesHeldTextThatTurnsOutNotToStop) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.push("abc ST"), "abc ");
  EXPECT_EQ(m.push("ILL"), "STILL");
  EXPECT_EQ(m.push("S"), "");
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.flush(), "S");
}

}  // namespace
}  // namespace lathe
