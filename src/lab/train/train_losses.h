// The training losses as functions of each sequence's summed target log-probability (see lora_gradient.h).
// Each returns the loss and d loss / d sum_logp_i, the weights LoraGradientEngine::backward takes.
// Preference batches are laid out [chosen_0..chosen_{B-1}, rejected_0..rejected_{B-1}] (ORPO with the full
// NLL scope appends [chosen_full_0..]: the chosen sequences with every token a target).
#pragma once
#include <vector>

#include "lab/train/lora_gradient.h"

namespace lathe::train {

struct LossResult {
  double loss = 0;
  std::vector<double> weight;       // d loss / d sum_logp, per sequence of the forward
  double accuracy = 0, margin = 0;  // preference methods: mean(adv > 0), mean(adv)
  int64_t n_targets = 0;
};

// Token-mean NLL over the batch: -sum(sum_logp) / sum(n_targets).
LossResult sft_loss(const SequenceLogProbs& lp);
// mean softplus(-beta * ((pc - refc) - (pr - refr))), summed response log-probs; ref from forward(false).
LossResult dpo_loss(const SequenceLogProbs& policy, const SequenceLogProbs& reference, double beta);
// L_NLL + lambda * mean softplus(-log_odds) on mean (length-normalised) log-probs l = sum / n:
// log_odds = (lw - lr) - (log(1 - e^lw) - log(1 - e^lr)). full_scope: L_NLL is the token-mean NLL of the third
// block (chosen, all tokens); otherwise L_NLL = -mean(lw).
LossResult orpo_loss(const SequenceLogProbs& lp, double lambda, bool full_scope);

// Numerically stable pieces, exposed for tests.
double softplus(double x);
double sigmoid(double x);
double log1mexp(double x);  // log(1 - e^x), x < 0

}  // namespace lathe::train
