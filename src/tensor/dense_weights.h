// Dense device copies of quantized weights for the CUDA multi-row matmul path (see
// engine/dense_weights_budget.h for the budget). Above the batched GEMV's row limit, linear() dequantizes a
// quantized weight to the activation type and calls cuBLAS; with a budget, the first such call for a weight keeps
// its dequantized copy, and later calls run the same cuBLAS GEMM on it without the dequantize. The copy is made
// by the same dequantize kernel, so the results are bit-identical to the path without copies.
//
// Copies are per weight storage (a fused q|k|v or gate|up weight and its per-module row views share one), made
// lazily on first use while the budget allows, and dropped once their weight is freed. Without the CUDA
// backend these are no-ops.
#pragma once
#include <cstdint>

#include "tensor/dtype.h"

namespace lathe {

struct QuantizedMatrix;

// Bytes that dense copies may take from now on (0: none; the default). Lowering it below what is held drops
// every copy.
void set_dense_weight_budget(int64_t bytes);

struct DenseWeightStats {
  int64_t budget_bytes = 0;
  int64_t held_bytes = 0;   // dense copies alive now
  int64_t copies = 0;       // how many
  int64_t over_budget = 0;  // weights that asked for a copy and were refused (counted once each)
};
DenseWeightStats dense_weight_stats();
void release_dense_weights();  // drops every copy (their memory returns to the caching allocator)
// Counts the times copies still in use were dropped (release, a lowered budget): a CUDA graph that read the
// old copies (model/batch_graph.h) must be captured again.
int64_t dense_weights_generation();

// Device memory free for new allocations: what the driver reports free plus the caching allocator's idle
// blocks. 0 without a device.
int64_t device_free_bytes();

namespace gpu {
// The dense copy of q's rows in type t (BF16 or F32), [q.rows(), q.cols()] contiguous, or null: no budget left,
// a layout the copies do not cover, or a graph being captured. Creates it on first use.
const void* dense_weight(const QuantizedMatrix& q, DType t);
}  // namespace gpu

}  // namespace lathe
