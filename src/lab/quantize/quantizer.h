// HF checkpoint (bf16/f16/f32 safetensors, one file or shards, VLM wrappers included) -> MLX affine checkpoint
// laid out as mlx_lm.convert writes it: sorted tensors in shards of at most shard_bytes with
// model.safetensors.index.json, config.json with the `quantization` (and `quantization_config`) dict, the
// tokenizer and generation files copied. Everything is written under <out>.tmp-<pid> and renamed to <out> at
// the end; on any failure the temporary folder is removed, so nothing partial appears under the final name.
//
// A module is quantized when its 2-D float `.weight` has an input size divisible by the group size (Linear
// layers, embeddings, an untied lm_head), as mlx-lm's default predicate; vision towers and projectors of a
// VLM wrapper pass through. One module is materialised at a time (peak memory ~ the largest tensor in f32
// rows chunks plus its packed form), rows quantized in parallel.
#pragma once
#include "jobs/job_types.h"
#include "lab/quantize/quantize_options.h"

namespace lathe::lab {

// Emits stages starting, quantizing (one per module, with bytes_done), writing, evaluating, done; returns
// the output path and a summary {source_bytes, output_bytes, parameters, quantized_parameters,
// bits_per_weight, seconds, source_gb_per_s, bits_histogram, kl?}.
jobs::JobResult quantize_checkpoint(const QuantizeOptions& options, const jobs::Emit& emit);

}  // namespace lathe::lab
