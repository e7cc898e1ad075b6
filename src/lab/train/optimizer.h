// AdamW with mlx semantics over the LoRA parameters: decoupled decay p <- p - lr*wd*p, then Adam with bias
// correction, eps added after sqrt(v_hat); f32 state. Plus global-norm gradient clipping. Two param groups:
// the A matrices at lr, the B matrices at lr * lora_plus_ratio (LoRA+: eta_B = lambda * eta_A; 1 = plain LoRA).
#pragma once
#include <cstdint>
#include <vector>

#include "lab/train/lora_gradient.h"

namespace lathe::train {

struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
  double lora_plus_ratio = 1.0;  // > 0 and finite (checked by the constructor)
};

class AdamW {
 public:
  AdamW(const LoraParams& params, AdamWOptions options);
  // One update with the grads as they are (clip first).
  void step(LoraParams& params, double lr);
  int64_t steps() const { return t_; }
  // State per tensor, in the order a0, b0, a1, b1, ... (for checkpoints).
  std::vector<std::vector<float>>& m() { return m_; }
  std::vector<std::vector<float>>& v() { return v_; }
  void set_steps(int64_t t) { t_ = t; }

 private:
  AdamWOptions o_;
  int64_t t_ = 0;
  std::vector<std::vector<float>> m_, v_;
};

// sqrt(sum of every grad squared), accumulated in double in a fixed order.
double global_grad_norm(const LoraParams& params);
// Scales every grad by max_norm / norm when norm > max_norm (max_norm <= 0: off). Returns the pre-clip norm.
double clip_grad_norm(LoraParams& params, double max_norm);
void clear_grads(LoraParams& params);
void scale_grads(LoraParams& params, double factor);

}  // namespace lathe::train
