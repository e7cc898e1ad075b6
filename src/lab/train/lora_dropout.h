// LoRA dropout as mlx-lm and PEFT apply it: in training the LoRA branch reads x * mask / (1 - p) (the base path
// reads x untouched), one Bernoulli(1 - p) keep per element. Masks are not drawn from a running generator but
// derived from a key (training seed, step, micro-batch, sequence, layer, module) and the element's index, so the
// per-layer recompute of backward, a resumed run and a rerun all see exactly the same mask.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "lab/train/lora_gradient.h"

namespace lathe::train {

// The key of one (sequence of the micro-batch, layer, module) of a dropout forward.
uint64_t dropout_stream(const LoraDropout& d, int64_t sequence, int64_t layer, int64_t module);
// n multipliers: 0 with probability p, else 1 / (1 - p); element i depends only on (stream, i). p in (0, 1).
std::shared_ptr<const std::vector<float>> dropout_mask(uint64_t stream, int64_t n, double p);

}  // namespace lathe::train
