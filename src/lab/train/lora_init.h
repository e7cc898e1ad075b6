// Fresh trainable LoRA pairs for a model's linear sites (mlx-lm's init): a uniform in ±1/sqrt(in), b zero, F32,
// on the targets whose module path ends with one of target_modules, in the last num_layers blocks.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "lab/train/lora_gradient.h"
#include "lora/linear_sites.h"

namespace lathe::train {

struct LoraSpec {
  int64_t rank = 8;
  float scale = 1.0f;    // as mlx-lm's lora_parameters.scale (not alpha)
  bool rs_lora = false;  // effective scale = scale / sqrt(rank)
  std::vector<std::string> target_modules = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                             "gate_proj", "up_proj", "down_proj"};
  int64_t num_layers = -1;  // -1: all blocks; N: the last N
  uint64_t seed = 0;
};

// The effective per-layer scale the residual uses.
float effective_scale(const LoraSpec& spec);

// Throws InvalidArgument when no site matches (naming the targets and a few of the model's modules).
LoraParams init_lora(const lora::LinearSites& sites, const LoraSpec& spec);

}  // namespace lathe::train
