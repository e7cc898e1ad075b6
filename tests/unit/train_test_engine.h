// A test double for the trainer: a bigram language model over a small vocabulary whose logits carry one LoRA
// pair, z(prev) = base[:, prev] + scale * b (a e_prev), with the exact analytic gradient (and LoRA dropout on
// e_prev with lora_dropout.h's masks, sequence i at layer 0, module 0). Real enough to learn
// (losses fall, preference margins move) and cheap, so the optimizer, schedule, accumulation, checkpoint and
// resume logic can be tested without the real gradient engine. Test-only: never in src/.
#pragma once
#include <cmath>
#include <vector>

#include "lab/train/lora_dropout.h"
#include "lab/train/lora_gradient.h"
#include "lora/linear_sites.h"

namespace lathe::test {

class BigramLoraEngine : public train::LoraGradientEngine {
 public:
  // base is [vocab, vocab] (logit of token t after token p at [t * vocab + p]).
  BigramLoraEngine(train::LoraParams& params, int64_t vocab, std::vector<float> base)
      : params_(params), vocab_(vocab), base_(std::move(base)) {}

  static lora::LinearSites sites(int64_t vocab) {
    lora::LinearSites s;
    s.add("model.layers.0.self_attn.q_proj", vocab, vocab);
    return s;
  }

  train::SequenceLogProbs forward(const std::vector<train::TrainSequence>& batch, bool with_adapter) override {
    train::SequenceLogProbs out;
    train::LoraDropout drop;
    if (with_adapter) last_ = batch, std::swap(drop, pending_), last_drop_ = drop;
    for (size_t i = 0; i < batch.size(); ++i) {
      const auto& s = batch[i];
      const auto keep = keeps(drop, i, s);
      double sum = 0;
      int64_t n = 0;
      for (size_t j = 1; j < s.ids.size(); ++j) {
        if (!s.target[j]) continue;
        const std::vector<double> z = logits(s.ids[j - 1], with_adapter ? keep[j - 1] : 0.0);
        sum += z[static_cast<size_t>(s.ids[j])] - logsumexp(z);
        ++n;
      }
      out.sum_logp.push_back(sum);
      out.n_targets.push_back(n);
    }
    return out;
  }

  void backward(const std::vector<double>& w) override {
    auto& p = params_.params.at(0);
    const int64_t r = p.a.dim(0), V = vocab_;
    const float* a = p.a.data<float>();
    const float* b = p.b.data<float>();
    float* ga = p.grad_a.data<float>();
    float* gb = p.grad_b.data<float>();
    for (size_t i = 0; i < last_.size(); ++i) {
      const auto& s = last_[i];
      const auto keep = keeps(last_drop_, i, s);
      for (size_t j = 1; j < s.ids.size(); ++j) {
        if (!s.target[j]) continue;
        const int32_t prev = s.ids[j - 1];
        const double m = keep[j - 1];
        std::vector<double> z = logits(prev, m);
        const double lse = logsumexp(z);
        // d logp / d z = onehot(t) - softmax(z), times the sequence's weight.
        std::vector<double> dz(static_cast<size_t>(V));
        for (int64_t t = 0; t < V; ++t)
          dz[static_cast<size_t>(t)] = w[i] * ((t == s.ids[j] ? 1.0 : 0.0) - std::exp(z[static_cast<size_t>(t)] - lse));
        for (int64_t t = 0; t < V; ++t)
          for (int64_t k = 0; k < r; ++k) {
            gb[t * r + k] += static_cast<float>(m * p.scale * dz[static_cast<size_t>(t)] * a[k * V + prev]);
            ga[k * V + prev] += static_cast<float>(m * p.scale * dz[static_cast<size_t>(t)] * b[t * r + k]);
          }
      }
    }
  }

  void dropout_next(const train::LoraDropout& d) override { pending_ = d; }

  int forwards = 0;

 private:
  // Per position r of a sequence, the multiplier dropout leaves on e_prev (the mask's element [r, prev]).
  std::vector<double> keeps(const train::LoraDropout& d, size_t seq, const train::TrainSequence& s) const {
    const size_t T = s.ids.size();
    std::vector<double> k(T, 1.0);
    if (d.p <= 0) return k;
    const auto mask = train::dropout_mask(train::dropout_stream(d, static_cast<int64_t>(seq), 0, 0),
                                          static_cast<int64_t>(T) * vocab_, d.p);
    for (size_t r = 0; r < T; ++r) k[r] = (*mask)[r * static_cast<size_t>(vocab_) + static_cast<size_t>(s.ids[r])];
    return k;
  }
  // adapter: the LoRA branch's input multiplier (0: the base alone; 1: no dropout).
  std::vector<double> logits(int32_t prev, double adapter) const {
    const auto& p = params_.params.at(0);
    const int64_t r = p.a.dim(0), V = vocab_;
    std::vector<double> z(static_cast<size_t>(V));
    for (int64_t t = 0; t < V; ++t) {
      double v = base_[static_cast<size_t>(t * V + prev)];
      if (adapter != 0)
        for (int64_t k = 0; k < r; ++k)
          v += adapter * (p.scale * p.b.data<float>()[t * r + k] * p.a.data<float>()[k * V + prev]);
      z[static_cast<size_t>(t)] = v;
    }
    return z;
  }
  static double logsumexp(const std::vector<double>& z) {
    double m = z[0];
    for (double v : z) m = std::max(m, v);
    double s = 0;
    for (double v : z) s += std::exp(v - m);
    return m + std::log(s);
  }

  train::LoraParams& params_;
  int64_t vocab_;
  std::vector<float> base_;
  std::vector<train::TrainSequence> last_;
  train::LoraDropout pending_, last_drop_;
};

}  // namespace lathe::test
