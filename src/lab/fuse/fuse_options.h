// What a fuse run is asked to do (the `fuse` job's config and `lathe fuse`'s flags): fold a LoRA adapter into
// its base checkpoint's weights and write the result as a new checkpoint.
#pragma once
#include <cstdint>
#include <string>

#include "jobs/job_types.h"

namespace lathe::lab {

struct FuseOptions {
  std::string model;        // base checkpoint directory (MLX affine-quantized, or bf16/f16/f32)
  std::string adapter;      // adapter directory (mlx-lm or PEFT layout)
  std::string output;       // the directory to create (must not exist)
  bool dequantize = false;  // write every quantized module dense (the scales' dtype) instead of re-quantizing
  uint64_t shard_bytes = uint64_t{5} << 30;
};

// Parses a job config {model, adapter, out, dequantize, shard_bytes}; throws InvalidArgument naming the field.
FuseOptions parse_fuse_options(const jobs::json& config);
void validate_fuse_options(const FuseOptions& o);
// The base has config.json and weights, the adapter folder exists, the output does not and its parent is
// writable; throws NotFound, InvalidArgument or OsError naming the path.
void validate_fuse_paths(const FuseOptions& o);

}  // namespace lathe::lab
