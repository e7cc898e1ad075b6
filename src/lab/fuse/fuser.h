// Folds a LoRA adapter into its base checkpoint (mlx_lm.fuse's job): for each module the adapter names,
// W' = W + scale·B·A computed in the weight's dtype as mlx-lm does (the factors rounded to it, the product
// accumulated in f32 and rounded, then added and rounded), and written as a new checkpoint by
// lab/checkpoint_writer.h (atomic: nothing appears under the output name unless the whole run succeeds).
//  - A dense base keeps its dtype.
//  - A quantized module is dequantized (q·scale + bias in the scales' dtype), fused and re-quantized with its own
//    bits and group size; modules the adapter does not touch are copied byte for byte.
//  - With dequantize, every quantized module is written dense in its scales' dtype and config.json loses its
//    quantization dict (a checkpoint to quantize again, or to hand to tools that need dense weights).
// The adapter must fit the base: a module it names that the base lacks, or whose shape differs, is an error
// naming the module, before anything is written.
#pragma once
#include "jobs/job_types.h"
#include "lab/fuse/fuse_options.h"

namespace lathe::lab {

// Emits stages starting, fusing (per fused module), writing, done; returns the output path and a summary
// {fused_modules, requantized_modules, dequantized_modules, adapter_format, rank, output_bytes, shards, seconds}.
jobs::JobResult fuse_adapter(const FuseOptions& options, const jobs::Emit& emit);

}  // namespace lathe::lab
