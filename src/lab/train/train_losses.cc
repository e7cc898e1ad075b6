#include "lab/train/train_losses.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace lathe::train {

double softplus(double x) { return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)); }

double sigmoid(double x) {
  if (x >= 0) return 1.0 / (1.0 + std::exp(-x));
  const double e = std::exp(x);
  return e / (1.0 + e);
}

double log1mexp(double x) { return x > -M_LN2 ? std::log(-std::expm1(x)) : std::log1p(-std::exp(x)); }

LossResult sft_loss(const SequenceLogProbs& lp) {
  LATHE_CHECK(lp.sum_logp.size() == lp.n_targets.size(), "log-prob vectors disagree");
  LossResult r;
  double sum = 0;
  for (size_t i = 0; i < lp.sum_logp.size(); ++i) sum += lp.sum_logp[i], r.n_targets += lp.n_targets[i];
  const double n = static_cast<double>(std::max<int64_t>(r.n_targets, 1));
  r.loss = -sum / n;
  r.weight.assign(lp.sum_logp.size(), -1.0 / n);
  return r;
}

LossResult dpo_loss(const SequenceLogProbs& policy, const SequenceLogProbs& reference, double beta) {
  const size_t n = policy.sum_logp.size();
  LATHE_CHECK(n % 2 == 0 && n > 0 && reference.sum_logp.size() == n, "DPO needs chosen/rejected pairs");
  const size_t b = n / 2;
  LossResult r;
  r.weight.assign(n, 0.0);
  for (size_t i = 0; i < b; ++i) {
    const double adv =
        beta * ((policy.sum_logp[i] - reference.sum_logp[i]) - (policy.sum_logp[b + i] - reference.sum_logp[b + i]));
    r.loss += softplus(-adv) / static_cast<double>(b);
    r.accuracy += (adv > 0 ? 1.0 : 0.0) / static_cast<double>(b);
    r.margin += adv / static_cast<double>(b);
    // d softplus(-adv) / d adv = -sigmoid(-adv)
    const double g = -sigmoid(-adv) * beta / static_cast<double>(b);
    r.weight[i] = g;
    r.weight[b + i] = -g;
  }
  for (size_t i = 0; i < n; ++i) r.n_targets += policy.n_targets[i];
  return r;
}

LossResult orpo_loss(const SequenceLogProbs& lp, double lambda, bool full_scope) {
  const size_t n = lp.sum_logp.size();
  const size_t blocks = full_scope ? 3 : 2;
  LATHE_CHECK(n % blocks == 0 && n > 0, "ORPO needs chosen/rejected(/chosen-full) blocks");
  const size_t b = n / blocks;
  const double bd = static_cast<double>(b);
  LossResult r;
  r.weight.assign(n, 0.0);
  // Mean log-probs must stay below 0 for the odds to exist; a perfect fit (0) is clamped just under it.
  constexpr double kMaxMeanLogp = -1e-9;
  for (size_t i = 0; i < b; ++i) {
    const double nw = static_cast<double>(std::max<int64_t>(lp.n_targets[i], 1));
    const double nr = static_cast<double>(std::max<int64_t>(lp.n_targets[b + i], 1));
    const double lw = std::min(lp.sum_logp[i] / nw, kMaxMeanLogp);
    const double lr = std::min(lp.sum_logp[b + i] / nr, kMaxMeanLogp);
    const double log_odds = (lw - lr) - (log1mexp(lw) - log1mexp(lr));
    r.loss += lambda * softplus(-log_odds) / bd;
    r.accuracy += (lw > lr ? 1.0 : 0.0) / bd;
    r.margin += log_odds / bd;
    // d log_odds / d lw = 1 / (1 - e^lw); d log_odds / d lr = -1 / (1 - e^lr).
    const double g = -lambda * sigmoid(-log_odds) / bd;
    r.weight[i] += g / (-std::expm1(lw)) / nw;
    r.weight[b + i] += -g / (-std::expm1(lr)) / nr;
    if (!full_scope) {
      r.loss += -lw / bd;
      r.weight[i] += -1.0 / bd / nw;
    }
  }
  if (full_scope) {
    double sum = 0;
    int64_t count = 0;
    for (size_t i = 2 * b; i < n; ++i) sum += lp.sum_logp[i], count += lp.n_targets[i];
    const double c = static_cast<double>(std::max<int64_t>(count, 1));
    r.loss += -sum / c;
    for (size_t i = 2 * b; i < n; ++i) r.weight[i] = -1.0 / c;
  }
  for (size_t i = 0; i < n; ++i) r.n_targets += lp.n_targets[i];
  return r;
}

}  // namespace lathe::train
