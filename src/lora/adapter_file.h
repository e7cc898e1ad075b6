// LoRA adapter directories as training tools write them, read into one normalised form.
//  - mlx-lm: adapters.safetensors with <module>.lora_a [in, r] and <module>.lora_b [r, out];
//    adapter_config.json with lora_parameters.{rank, scale} (scale used as given).
//  - PEFT: adapter_model.safetensors with <module>.lora_A.weight [r, in] and <module>.lora_B.weight [out, r];
//    adapter_config.json with r and lora_alpha (scale = alpha / r, or alpha / sqrt(r) with use_rslora),
//    per-module rank_pattern / alpha_pattern.
// The layout comes from the tensor names; the shapes must then agree with it (a pair whose rank dimensions do not
// line up is an error naming the module, never silently transposed). Both give a = [r, in], b = [out, r] in F32
// (each a Linear weight), so the residual is scale · b·(a·x).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace lathe::lora {

// Limits on adapter input (files come from users and from HTTP mount requests).
constexpr size_t kMaxAdapterConfigBytes = 1 << 20;
constexpr size_t kMaxAdapterTensors = 100000;
constexpr int64_t kMaxAdapterRank = 4096;

struct LoraFactor {
  std::string module;  // canonical path, e.g. "model.layers.0.self_attn.q_proj"
  Tensor a;            // [r, in] F32
  Tensor b;            // [out, r] F32
  float scale = 1.0f;
  int64_t rank() const { return a.dim(0); }
  int64_t in() const { return a.dim(1); }
  int64_t out() const { return b.dim(0); }
};

// What adapter_config.json says, without reading the weights (the store scan lists these).
struct AdapterConfig {
  std::string dir;
  std::string format;        // "mlx-lm" or "peft"
  std::string weights_path;  // dir/adapters.safetensors or dir/adapter_model.safetensors
  int64_t rank = 0;
  float scale = 1.0f;
  double alpha = 0;  // PEFT
  bool rslora = false;
  std::string base_model;  // as written (a hub-cache snapshot path maps back to org/name: see base_model_name)
  std::vector<std::pair<std::string, int64_t>> rank_pattern;
  std::vector<std::pair<std::string, double>> alpha_pattern;
  size_t weights_bytes = 0;
};

struct AdapterWeights {
  AdapterConfig config;
  std::vector<LoraFactor> factors;
  size_t skipped = 0;  // tensors that are not LoRA factors (e.g. modules_to_save), counted and left out
};

// Throws Error(NotFound) when dir holds no adapter, Error(Corrupt/Unsupported) naming the file on bad content, and
// OsError (errno kept: EACCES for a folder that may not be searched) when the files cannot be looked at.
AdapterConfig read_adapter_config(const std::string& dir);
AdapterWeights read_adapter(const std::string& dir);
// ".../models--org--name/snapshots/<rev>" -> "org/name"; other strings unchanged.
std::string base_model_name(const std::string& name_or_path);

}  // namespace lathe::lora
