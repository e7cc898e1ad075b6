#include "engine/sampler.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>

#include "common/error.h"
#include "engine/logits_processors.h"
#include "tensor/cpu/row_scan.h"

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

// Entries ranked as a stable descending sort ranks them: larger value first, the lower index on ties. That is a
// total order, so a plain (partial) sort of contiguous pairs gives the stable sort's order at a fraction of the
// cost of sorting indices that point into the vocabulary. NaN ranks as -inf (a strict weak order even then).
struct Ranked {
  float v;
  uint32_t i;
};
bool ranks_before(const Ranked& a, const Ranked& b) { return a.v > b.v || (a.v == b.v && a.i < b.i); }
Ranked ranked(const std::vector<float>& x, size_t i) {
  return {std::isnan(x[i]) ? kNegInf : x[i], static_cast<uint32_t>(i)};
}

// Sorts entries given in index order into that order. Many entries (a flat distribution leaves most of the
// vocabulary to top_p) go through a stable LSD radix sort on the value's bits — ties keep their index order, as
// the stable sort kept them — three passes over 151k entries instead of a comparison sort's ~17.
void sort_ranked(std::vector<Ranked>& r) {
  if (r.size() < 512) {
    std::sort(r.begin(), r.end(), ranks_before);
    return;
  }
  // Descending float order as ascending unsigned keys; -0 and +0 compare equal, so both map to +0's key.
  auto key = [](float v) {
    if (v == 0.0f) v = 0.0f;
    uint32_t u;
    std::memcpy(&u, &v, sizeof u);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);  // ascending with v
    return ~u;                                       // descending
  };
  std::vector<Ranked> tmp(r.size());
  std::vector<uint32_t> keys(r.size()), tmp_keys(r.size());
  for (size_t j = 0; j < r.size(); ++j) keys[j] = key(r[j].v);
  for (const int shift : {0, 11, 22}) {
    std::array<uint32_t, 2049> count{};
    for (uint32_t k : keys) ++count[((k >> shift) & 0x7FFu) + 1];
    for (size_t d = 1; d < count.size(); ++d) count[d] += count[d - 1];
    for (size_t j = 0; j < r.size(); ++j) {
      const uint32_t at = count[(keys[j] >> shift) & 0x7FFu]++;
      tmp[at] = r[j];
      tmp_keys[at] = keys[j];
    }
    r.swap(tmp);
    keys.swap(tmp_keys);
  }
}

// The first k indices of x in that order.
std::vector<size_t> top_indices(const std::vector<float>& x, size_t k) {
  k = std::min(k, x.size());
  std::vector<Ranked> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = ranked(x, i);
  std::partial_sort(r.begin(), r.begin() + static_cast<std::ptrdiff_t>(k), r.end(), ranks_before);
  std::vector<size_t> out(k);
  for (size_t j = 0; j < k; ++j) out[j] = r[j].i;
  return out;
}

// x = -inf everywhere but at the given entries.
void keep_only(std::vector<float>& x, const std::vector<Ranked>& kept, size_t n) {
  std::fill(x.begin(), x.end(), kNegInf);
  for (size_t j = 0; j < n; ++j) x[kept[j].i] = kept[j].v;
}

// The first maximum of lp when it is also what greedy picks after a mask that keeps it and a log-softmax, or -1.
// Masking only removes competitors; log-softmax subtracts one constant, whose rounding could merge values closer
// than a few ulps of its result (|result| ≤ log(vocab) near the top, so below 1e-5): an earlier entry that close
// could then win the tie, and the caller builds the mask instead.
// Two vectorized passes (tensor/cpu/row_scan.h): the maximum and whether any entry is NaN, then the first entry
// within the tie margin of it, which is the first maximum itself exactly when no earlier entry comes that close.
int64_t unmasked_argmax_if_exact(std::span<const float> lp) {
  const cpu::RowMax r = cpu::row_max(lp.data(), lp.size());
  if (r.nan || !std::isfinite(r.max)) return -1;
  constexpr float kTieMargin = 1e-4f;
  const size_t i = cpu::first_at_least(lp.data(), lp.size(), r.max - kTieMargin);
  return i < lp.size() && lp[i] == r.max ? static_cast<int64_t>(i) : -1;
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
  if (!(top_p > 0.0f && top_p < 1.0f) || lp.empty()) return;
  // Walk the tokens from the most likely down, adding their probabilities (in double, in that order) until the
  // mass reaches top_p; the rest become -inf. Only the walk's prefix needs sorting: first try the tokens within
  // a few nats of the best (every other token ranks after all of them, so their sorted order is the full sort's
  // first entries and the walk adds the same numbers in the same order); when the walk does not end inside
  // them, sort everything.
  float mx = kNegInf;
  for (float v : lp)
    if (v > mx) mx = v;  // NaN never is
  for (const float window : {12.0f, std::numeric_limits<float>::infinity()}) {
    const float cut = mx - window;  // -inf for the last window: every entry but NaN
    std::vector<Ranked> cand;
    for (size_t i = 0; i < lp.size(); ++i)
      if (lp[i] >= cut) cand.push_back(ranked(lp, i));
    sort_ranked(cand);
    double mass = 0;
    for (size_t j = 0; j < cand.size(); ++j) {
      mass += std::exp(static_cast<double>(cand[j].v));
      if (mass >= top_p) {
        if (j + 1 < lp.size()) keep_only(lp, cand, j + 1);
        return;
      }
    }
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
  // The k first in the stable descending order stay; the rest become -inf. After top_p most entries often are
  // -inf already: when at most k are not, nothing changes.
  std::vector<Ranked> finite;
  for (size_t i = 0; i < lp.size(); ++i)
    if (lp[i] != kNegInf) finite.push_back(ranked(lp, i));
  if (finite.size() <= static_cast<size_t>(k)) return;
  std::partial_sort(finite.begin(), finite.begin() + k, finite.end(), ranks_before);
  keep_only(lp, finite, static_cast<size_t>(k));
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

namespace {
uint64_t sampler_step_key(uint64_t seed, uint64_t step) { return splitmix(seed ^ splitmix(step)); }
constexpr uint64_t kXtcStream = 0x58544321ull, kCategoricalStream = 0x43415447ull;
}  // namespace

double categorical_draw(uint64_t seed, uint64_t step) {
  return uniform(sampler_step_key(seed, step) ^ kCategoricalStream);
}
double xtc_draw(uint64_t seed, uint64_t step) { return uniform(sampler_step_key(seed, step) ^ kXtcStream); }

Sampler::Sampler(SamplingParams params, std::vector<int32_t> xtc_exempt)
    : p_(std::move(params)), xtc_exempt_(std::move(xtc_exempt)) {
  p_.validate();
  seed_ = p_.seed ? *p_.seed : std::random_device{}() * 0x100000001ull + std::random_device{}();
  if (p_.constraint) constraint_ = p_.constraint->start();
}

void Sampler::take(int32_t token) {
  ++step_;
  if (constraint_) constraint_->accept(token);
}

SampleResult Sampler::sample(std::span<const float> logits, std::span<const int32_t> history, int top_logprobs,
                             bool want_logprob) {
  if (logits.empty()) throw Error(ErrorKind::InvalidArgument, "sample: empty logits");
  // The logits are copied only when a processor edits them or the full path needs its own row.
  const std::vector<LogitEdit> edits = logit_edits(p_, history, logits.size());
  std::vector<float> lp;
  if (!edits.empty()) {
    lp.assign(logits.begin(), logits.end());
    apply_row_edits(lp, edits);
  }
  SampleResult r;
  // Greedy with nothing but the id wanted: the argmax, without the log-softmax pass, and under a constraint
  // without its mask when the constraint allows that token (the common case).
  if (p_.temperature == 0.0f && top_logprobs == 0 && !want_logprob) {
    const int64_t t = unmasked_argmax_if_exact(edits.empty() ? logits : std::span<const float>(lp));
    if (t >= 0 && (!constraint_ || constraint_->allows(static_cast<int32_t>(t)))) {
      ++step_;  // the step's draw is not used, but later steps keep their keys
      r.token = static_cast<int32_t>(t);
      if (constraint_) constraint_->accept(r.token);
      return r;
    }
  }
  if (edits.empty()) lp.assign(logits.begin(), logits.end());
  if (constraint_) constraint_->mask(lp);
  log_softmax(lp);
  if (top_logprobs > 0) {
    const auto idx = top_indices(lp, static_cast<size_t>(top_logprobs));
    for (size_t i = 0; i < idx.size(); ++i)
      if (lp[idx[i]] != kNegInf) r.top.push_back({static_cast<int32_t>(idx[i]), lp[idx[i]]});
  }
  const uint64_t step = step_++;
  if (p_.temperature == 0.0f) {
    r.token = static_cast<int32_t>(std::max_element(lp.begin(), lp.end()) - lp.begin());
  } else {
    std::vector<float> f = lp;
    filter_top_p(f, p_.top_p);
    filter_min_p(f, p_.min_p);
    if (p_.xtc_probability > 0.0f && xtc_draw(seed_, step) < p_.xtc_probability)
      filter_xtc(f, p_.xtc_threshold, xtc_exempt_);
    filter_top_k(f, p_.top_k);
    // Categorical over softmax(f / T) by inverse CDF with the step's own draw.
    const float inv_t = 1.0f / p_.temperature;
    const float mx = *std::max_element(f.begin(), f.end());
    double total = 0;
    for (float v : f)
      if (v != kNegInf) total += std::exp(static_cast<double>((v - mx) * inv_t));
    const double u = categorical_draw(seed_, step) * total;
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
