// Logits processors, applied in mlx-lm's order before any sampling: logit_bias, repetition penalty, presence
// penalty, frequency penalty. The history is prompt + generated tokens.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "engine/sampling_params.h"
#include "tensor/logit_edit.h"

namespace lathe {

// The edits a row's processors make, one per touched token in token order, at flat index offset + token: the host
// applies them to its row, the device sampler to a whole step's logits.
std::vector<LogitEdit> logit_edits(const SamplingParams& p, std::span<const int32_t> history, size_t vocab,
                                   int64_t offset = 0);

// Applies edits made for this row (offset 0) to it.
void apply_row_edits(std::vector<float>& logits, const std::vector<LogitEdit>& edits);
void apply_logits_processors(std::vector<float>& logits, const SamplingParams& p, std::span<const int32_t> history);

}  // namespace lathe
