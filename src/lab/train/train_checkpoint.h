// Training checkpoints: <adapter_path>/checkpoints/step-NNNNNNNN/ holding a mountable adapter (adapters.safetensors,
// adapter_config.json), optimizer.safetensors (AdamW m / v per factor) and state.json (step, optimizer steps,
// seed, lora_dropout, the data cursor). The folder is written as step-N.tmp and renamed, so a kill never leaves half a
// checkpoint; resume takes the highest complete step. Resuming restores every bit the next step depends on.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "lab/train/lora_gradient.h"
#include "lab/train/optimizer.h"
#include "lab/train/train_config.h"

namespace lathe::train {

struct TrainState {
  int64_t step = 0;          // completed optimizer steps
  int64_t batches_seen = 0;  // the data cursor (BatchPlan index of the next micro-batch)
  uint64_t seed = 0;
  double lora_dropout = 0;  // the masks' p: a resume with another would not redo the same steps
};

std::string save_checkpoint(const std::string& adapter_path, const TrainConfig& config, const LoraParams& params,
                            AdamW& optimizer, const TrainState& state);
// The last complete checkpoint's directory, if any.
std::optional<std::string> latest_checkpoint(const std::string& adapter_path);
// Loads a checkpoint into params / optimizer (shapes must match this run); throws Corrupt naming the file.
TrainState load_checkpoint(const std::string& dir, LoraParams& params, AdamW& optimizer);

}  // namespace lathe::train
