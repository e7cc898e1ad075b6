// One batch's loss and LoRA gradients, as `lathe train grads` computes them (and the parity tests check): the
// token-mean NLL over every target of the batch and d loss / d lora_a, lora_b in mlx-lm layout.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lab/train/lora_gradient.h"
#include "model/model.h"

namespace lathe::train {

// {batch: [[ids...], ...], prompt_lens: [n, ...]}: sequence i's targets are positions j >= prompt_lens[i]
// (token j predicted from j - 1). Throws Error(InvalidArgument) naming `where` and the field on bad input.
std::vector<TrainSequence> parse_grad_batch(const nlohmann::json& j, const std::string& where);
std::vector<TrainSequence> read_grad_batch(const std::string& path);

struct NamedGrad {
  std::string name;  // "<module>.lora_a.grad" [in, r] or "<module>.lora_b.grad" [r, out]
  Tensor value;      // F32
};
struct BatchGrads {
  double loss = 0;  // token-mean NLL
  int64_t targets = 0;
  std::vector<NamedGrad> grads;
};

// Loads the adapter at adapter_dir as trainable params, runs forward + backward on the engine of `device` (CPU
// or CUDA, both f32).
BatchGrads compute_batch_grads(const Model& model, const std::string& adapter_dir,
                               const std::vector<TrainSequence>& batch, Device device = Device::CPU);
// Writes the grads as F32 safetensors (atomic).
void write_grads(const BatchGrads& g, const std::string& path);

}  // namespace lathe::train
