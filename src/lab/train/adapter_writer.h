// Writes trained LoRA pairs as an mlx-lm adapter folder: adapters.safetensors (<module>.lora_a [in, r] and
// <module>.lora_b [r, out], F32) and adapter_config.json (mlx-lm's lora_parameters plus PEFT-flavoured keys,
// base_model and the training config). Each file is written atomically; lora::read_adapter reads it back.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "lab/train/lora_gradient.h"
#include "lab/train/train_config.h"

namespace lathe::train {

nlohmann::ordered_json adapter_config_json(const TrainConfig& config, const LoraParams& params);
void write_adapter(const std::string& dir, const TrainConfig& config, const LoraParams& params);
// The adapter's weights alone (used by checkpoints too).
void write_adapter_weights(const std::string& path, const LoraParams& params);
// Reads the a / b of an adapter written by write_adapter_weights into params (same modules and shapes).
void read_adapter_weights(const std::string& path, LoraParams& params);

}  // namespace lathe::train
