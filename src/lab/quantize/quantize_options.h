// What a quantize run is asked to do (the `quantize` job's config and `lathe quantize`'s flags) and the recipes
// that pick each module's bits: uniform, embeddings and lm_head at 8 bits (`embed_8`), and mlx-lm's mixed
// presets (`mixed_2_6`, `mixed_3_4`, `mixed_3_6`, `mixed_4_6`: v_proj and down_proj of the first and last
// eighth of the layers and every third layer between, and lm_head, at the high bits; the rest at the low).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "jobs/job_types.h"

namespace lathe::lab {

struct QuantizeOptions {
  std::string source;  // HF checkpoint directory (bf16/f16/f32; single file or sharded; VLM wrappers)
  std::string output;  // the directory to create (must not exist)
  int bits = 4;
  int group_size = 64;
  std::string recipe = "uniform";
  uint64_t shard_bytes = uint64_t{5} << 30;  // output shards, like mlx_lm.convert
  int eval_tokens = 64;                      // tokens per prompt for the KL summary; 0 skips it
};

// Parses and validates a job config {model, out, bits, group_size, recipe, shard_bytes, eval_tokens}; throws
// Error(InvalidArgument) naming the field. Checks nothing on disk (that is validate_paths).
QuantizeOptions parse_quantize_options(const jobs::json& config);
void validate_quantize_options(const QuantizeOptions& o);
// Source has a config.json and weights, output does not exist and its parent is writable; throws NotFound,
// InvalidArgument or Io naming the path.
void validate_quantize_paths(const QuantizeOptions& o);

struct ModuleBits {
  int bits, group_size;
};
// The bits for a quantizable module `name` (a stored tensor name without ".weight") of a model with
// `num_layers` decoder layers.
ModuleBits module_bits(const QuantizeOptions& o, const std::string& name, int num_layers);

}  // namespace lathe::lab
