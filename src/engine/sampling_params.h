// Sampling settings of one request, with mlx-lm's defaults and meanings.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "engine/token_constraint.h"

namespace lathe {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy
  float top_p = 0.0f;        // 0 or ≥ 1 = off; else keep the smallest set with probability mass ≥ top_p
  int top_k = 0;             // 0 = off
  float min_p = 0.0f;        // 0 = off; keep tokens with p ≥ min_p · p_max
  float xtc_probability = 0.0f;
  float xtc_threshold = 0.0f;
  float repetition_penalty = 1.0f;   // 1 = off; negative logits × p, positive ÷ p
  int repetition_context_size = 20;  // 0 = whole history
  float presence_penalty = 0.0f;
  int presence_context_size = 20;
  float frequency_penalty = 0.0f;
  int frequency_context_size = 20;
  std::map<int32_t, float> logit_bias;
  std::optional<uint64_t> seed;
  // Structured output: a grammar whose mask applies after the processors, before log-softmax (null = none).
  std::shared_ptr<const TokenConstraint> constraint;

  // Throws Error(InvalidArgument) naming the field for out-of-range values.
  void validate() const;
};

}  // namespace lathe
