// ModelConfig: config.json read once into typed fields, accepting both spellings (legacy rope_theta /
// rope_scaling and transformers-5 rope_parameters, flat or per layer type), a nested text_config, and the
// MLX quantization dict with per-module overrides. Architecture-specific keys stay reachable through text().
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tensor/tensor.h"

namespace lathe {

struct RopeParams {
  std::string type = "default";  // default | linear | llama3 | proportional | yarn | ...
  double theta = 10000.0;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 0;
  double partial_rotary_factor = 1.0;
};

struct QuantSpec {
  int bits = 4;
  int group_size = 64;
};

// Where a model runs: the device its weights and caches live on and the activation type (the CPU computes in
// F32; CUDA in F32 or BF16). Not read from config.json: set by load_model.
struct LoadOptions {
  Device device = Device::CPU;
  DType dtype = DType::F32;
  // CPU: keep quantized matmuls on the exact f32 kernels (parity suites) instead of the default integer-dot
  // kernels over weights repacked at load (int8 activations per group; tensor/cpu/packed_quant.h).
  bool exact = false;
};

struct ModelConfig {
  std::string dir;
  std::string model_type;  // of the text model (text_config.model_type when nested)
  int64_t hidden_size = 0, intermediate_size = 0, num_layers = 0, num_heads = 0, num_kv_heads = 0;
  int64_t head_dim = 0, vocab_size = 0, max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  std::string hidden_act;
  std::vector<std::string> layer_types;  // per layer: full_attention | sliding_attention | linear_attention
  int64_t sliding_window = 0;
  std::map<std::string, RopeParams> rope;  // by layer type
  std::vector<int> eos_token_ids;
  std::optional<int> bos_token_id;

  std::optional<QuantSpec> quant_default;
  std::map<std::string, std::optional<QuantSpec>> quant_overrides;  // nullopt = "false": not quantized

  LoadOptions load;  // placement chosen by the caller of load_model

  nlohmann::json root;  // the whole config.json
  nlohmann::json text;  // the text model's config (root or root.text_config)

  // The quantization of a module path ("model.layers.0.mlp.down_proj"), or nullopt.
  std::optional<QuantSpec> quant_for(const std::string& module) const;
  const RopeParams& rope_for_layer(int64_t layer) const;
  bool is_sliding(int64_t layer) const { return layer_types[static_cast<size_t>(layer)] == "sliding_attention"; }

  // Typed access to text-config keys with a default; throws naming the key when the type is wrong.
  int64_t get_int(const std::string& key, int64_t dflt) const;
  double get_double(const std::string& key, double dflt) const;
  bool get_bool(const std::string& key, bool dflt) const;
  std::string get_string(const std::string& key, const std::string& dflt) const;
  bool has(const std::string& key) const { return text.contains(key) && !text[key].is_null(); }
};

// Reads DIR/config.json. Throws Error naming the file and key on anything missing or mistyped.
ModelConfig load_model_config(const std::string& dir);
ModelConfig parse_model_config(const nlohmann::json& root, const std::string& dir);

}  // namespace lathe
