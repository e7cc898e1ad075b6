#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "common/error.h"
#include "engine/logits_processors.h"

namespace lathe {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A uniform double in [0, 1) from a 64-bit key.
double uniform(uint64_t key) { return static_cast<double>(splitmix(key) >> 11) * 0x1.0p-53; }

void log_softmax(std::vector<float>& x) {
  const float mx = *std::max_element(x.begin(), x.end());
  double sum = 0;
  for (float v : x) sum += std::exp(static_cast<double>(v - mx));
  const float lse = mx + static_cast<float>(std::log(sum));
  for (float& v : x) v -= lse;
}

std::vector<size_t> order_desc(const std::vector<float>& x) {
  std::vector<size_t> idx(x.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return x[a] > x[b]; });
  return idx;
}

// The first maximum of lp when it is also what greedy picks after a mask that keeps it and a log-softmax, or -1.
// Masking only removes competitors; log-softmax subtracts one constant, whose rounding could merge values closer
// than a few ulps of its result (|result| ≤ log(vocab) near the top, so below 1e-5): an earlier entry that close
// could then win the tie, and the caller builds the mask instead.
int64_t unmasked_argmax_if_exact(const std::vector<float>& lp) {
  size_t t = 0;
  for (size_t i = 0; i < lp.size(); ++i) {
    if (std::isnan(lp[i])) return -1;
    if (lp[i] > lp[t]) t = i;
  }
  const float m = lp[t];
  if (!std::isfinite(m)) return -1;
  constexpr float kTieMargin = 1e-4f;
  for (size_t i = 0; i < t; ++i)
    if (lp[i] >= m - kTieMargin) return -1;
  return static_cast<int64_t>(t);
}

}  // namespace

void SamplingParams::validate() const {
  auto bad = [](const char* field, const std::string& why) {
    throw Error(ErrorKind::InvalidArgument, std::string(field) + " " + why);
  };
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) bad("temperature", "must be ≥ 0");
  if (!(top_p >= 0.0f && top_p <= 1.0f)) bad("top_p", "must be in [0, 1]");
  if (top_k < 0) bad("top_k", "must be ≥ 0");
  if (!(min_p >= 0.0f && min_p <= 1.0f)) bad("min_p", "must be in [0, 1]");
  if (!(xtc_probability >= 0.0f && xtc_probability <= 1.0f)) bad("xtc_probability", "must be in [0, 1]");
  if (!(xtc_threshold >= 0.0f && xtc_threshold <= 0.5f)) bad("xtc_threshold", "must be in [0, 0.5]");
  if (!(repetition_penalty >= 0.0f) || !std::isfinite(repetition_penalty)) bad("repetition_penalty", "must be ≥ 0");
  if (repetition_context_size < 0) bad("repetition_context_size", "must be ≥ 0");
  if (presence_context_size < 0) bad("presence_context_size", "must be ≥ 0");
  if (frequency_context_size < 0) bad("frequency_context_size", "must be ≥ 0");
  if (!std::isfinite(presence_penalty)) bad("presence_penalty", "must be finite");
  if (!std::isfinite(frequency_penalty)) bad("frequency_penalty", "must be finite");
  for (const auto& [id, b] : logit_bias)
    if (!std::isfinite(b)) bad("logit_bias", "values must be finite (token " + std::to_string(id) + ")");
}

void filter_top_p(std::vector<float>& lp, float top_p) {
  if (!(top_p > 0.0f && top_p < 1.0f)) return;
  double mass = 0;
  bool reached = false;
  for (size_t i : order_desc(lp)) {
    if (reached) {
      lp[i] = kNegInf;
      continue;
    }
    mass += std::exp(static_cast<double>(lp[i]));
    if (mass >= top_p) reached = true;
  }
}

void filter_min_p(std::vector<float>& lp, float min_p) {
  if (!(min_p > 0.0f)) return;
  const float mx = *std::max_element(lp.begin(), lp.end());
  const float threshold = mx + std::log(min_p);
  for (float& v : lp)
    if (v < threshold && v != mx) v = kNegInf;
}

void filter_top_k(std::vector<float>& lp, int k) {
  if (k <= 0 || static_cast<size_t>(k) >= lp.size()) return;
  const auto idx = order_desc(lp);
  for (size_t r = static_cast<size_t>(k); r < idx.size(); ++r) lp[idx[r]] = kNegInf;
}

void filter_xtc(std::vector<float>& lp, float threshold, std::span<const int32_t> exempt) {
  const float log_t = std::log(threshold);
  std::vector<size_t> above;
  for (size_t i = 0; i < lp.size(); ++i)
    if (lp[i] > log_t) above.push_back(i);
  if (above.size() < 2) return;
  // Remove every token above the threshold but the least likely of them.
  const size_t keep = *std::min_element(above.begin(), above.end(), [&](size_t a, size_t b) { return lp[a] < lp[b]; });
  for (size_t i : above)
    if (i != keep && std::find(exempt.begin(), exempt.end(), static_cast<int32_t>(i)) == exempt.end()) lp[i] = kNegInf;
}

Sampler::Sampler(SamplingParams params, std::vector<int32_t> xtc_exempt)
    : p_(std::move(params)), xtc_exempt_(std::move(xtc_exempt)) {
  p_.validate();
  seed_ = p_.seed ? *p_.seed : std::random_device{}() * 0x100000001ull + std::random_device{}();
  if (p_.constraint) constraint_ = p_.constraint->start();
}

SampleResult Sampler::sample(std::span<const float> logits, std::span<const int32_t> history, int top_logprobs,
                             bool want_logprob) {
  if (logits.empty()) throw Error(ErrorKind::InvalidArgument, "sample: empty logits");
  std::vector<float> lp(logits.begin(), logits.end());
  apply_logits_processors(lp, p_, history);
  SampleResult r;
  // Greedy with nothing but the id wanted: the argmax, without the log-softmax pass, and under a constraint
  // without its mask when the constraint allows that token (the common case).
  if (p_.temperature == 0.0f && top_logprobs == 0 && !want_logprob) {
    const int64_t t = unmasked_argmax_if_exact(lp);
    if (t >= 0 && (!constraint_ || constraint_->allows(static_cast<int32_t>(t)))) {
      ++step_;  // the step's draw is not used, but later steps keep their keys
      r.token = static_cast<int32_t>(t);
      if (constraint_) constraint_->accept(r.token);
      return r;
    }
  }
  if (constraint_) constraint_->mask(lp);
  log_softmax(lp);
  if (top_logprobs > 0) {
    const auto idx = order_desc(lp);
    for (size_t i = 0; i < std::min(idx.size(), static_cast<size_t>(top_logprobs)); ++i)
      if (lp[idx[i]] != kNegInf) r.top.push_back({static_cast<int32_t>(idx[i]), lp[idx[i]]});
  }
  const uint64_t step_key = splitmix(seed_ ^ splitmix(step_++));
  if (p_.temperature == 0.0f) {
    r.token = static_cast<int32_t>(std::max_element(lp.begin(), lp.end()) - lp.begin());
  } else {
    std::vector<float> f = lp;
    filter_top_p(f, p_.top_p);
    filter_min_p(f, p_.min_p);
    if (p_.xtc_probability > 0.0f && uniform(step_key ^ 0x58544321ull) < p_.xtc_probability)
      filter_xtc(f, p_.xtc_threshold, xtc_exempt_);
    filter_top_k(f, p_.top_k);
    // Categorical over softmax(f / T) by inverse CDF with the step's own draw.
    const float inv_t = 1.0f / p_.temperature;
    const float mx = *std::max_element(f.begin(), f.end());
    double total = 0;
    for (float v : f)
      if (v != kNegInf) total += std::exp(static_cast<double>((v - mx) * inv_t));
    const double u = uniform(step_key ^ 0x43415447ull) * total;
    double acc = 0;
    r.token = static_cast<int32_t>(std::max_element(f.begin(), f.end()) - f.begin());
    for (size_t i = 0; i < f.size(); ++i) {
      if (f[i] == kNegInf) continue;
      acc += std::exp(static_cast<double>((f[i] - mx) * inv_t));
      if (u < acc) {
        r.token = static_cast<int32_t>(i);
        break;
      }
    }
  }
  r.logprob = lp[static_cast<size_t>(r.token)];
  if (constraint_) constraint_->accept(r.token);
  return r;
}

}  // namespace lathe
