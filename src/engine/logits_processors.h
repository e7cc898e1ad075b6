// Logits processors, applied in mlx-lm's order before any sampling: logit_bias, repetition penalty, presence
// penalty, frequency penalty. The history is prompt + generated tokens.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "engine/sampling_params.h"

namespace lathe {

void apply_logits_processors(std::vector<float>& logits, const SamplingParams& p, std::span<const int32_t> history);

}  // namespace lathe
