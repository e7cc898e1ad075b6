// The contract between the trainer (data, losses, optimizer, checkpoints) and the gradient engine (autograd over
// a frozen base with trainable LoRA A/B). Every training loss lathe offers (SFT, DPO, ORPO) is a function of each
// sequence's summed target log-probability and target count, so the engine only needs to return those and, given
// d loss / d sum_logp per sequence, add the parameter gradients.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace lathe::train {

// One trainable LoRA pair: y = W x + scale * b (a x). Shapes as lora::LoraFactor (a [r, in], b [out, r]), F32
// master weights on the host; grad_a / grad_b have the same shapes and accumulate until the trainer clears them.
struct LoraParam {
  std::string module;  // canonical path, e.g. "model.layers.0.self_attn.q_proj"
  Tensor a, b;
  Tensor grad_a, grad_b;
  float scale = 1.0f;
};

struct LoraParams {
  std::vector<LoraParam> params;
};

// One sequence: ids and, per position j, whether token j is a target (predicted from position j - 1; position 0
// is never a target). A packed row (train_packing.h) holds several examples back to back: segments gives their
// lengths in order (summing to ids.size()); each one attends only within itself, its positions restart at 0 and
// its first token is never a target. Empty segments: one example.
struct TrainSequence {
  std::vector<int32_t> ids;
  std::vector<uint8_t> target;
  std::vector<int64_t> segments;
};

struct SequenceLogProbs {
  std::vector<double> sum_logp;    // per sequence: sum over targets of log p(token_j | tokens_<j)
  std::vector<int64_t> n_targets;  // per sequence
};

// LoRA dropout for one training forward (lora_dropout.h): probability p (0: none) and the key its masks derive from.
struct LoraDropout {
  double p = 0;
  uint64_t seed = 0;
  int64_t step = 0, micro = 0;  // the optimizer step and the micro-batch within it
};

class LoraGradientEngine {
 public:
  virtual ~LoraGradientEngine() = default;
  // Forward over a batch. with_adapter=false runs the frozen base alone (DPO's reference policy) and keeps nothing
  // for backward.
  virtual SequenceLogProbs forward(const std::vector<TrainSequence>& batch, bool with_adapter) = 0;
  // Backward of the last forward(with_adapter=true): adds sum_i weight[i] * d sum_logp_i / d theta to every
  // param's grad_a / grad_b. (SFT's token-mean NLL: weight[i] = -1 / total targets.)
  virtual void backward(const std::vector<double>& weight_per_sequence) = 0;
  // Dropout for the next forward(with_adapter=true) and the backward that follows it, then none again: every
  // other forward (validation, DPO's reference, `lathe train grads`) runs the LoRA branch without dropout.
  virtual void dropout_next(const LoraDropout& dropout) = 0;
};

}  // namespace lathe::train
