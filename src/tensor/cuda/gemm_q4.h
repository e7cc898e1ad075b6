// Tensor-core GEMM over 4-bit MLX weights for a batched decode step's rows (gemm_q4.cu): reads the packed codes,
// not a dense bf16 copy.
#pragma once
#include <cstdint>

#include "tensor/cuda/kernels.h"

namespace lathe::cuda {

// How gemm_q4 would run y[M, N] = x[M, K] · Wᵀ: covered (4-bit, bf16 scales and biases, group 32/64/128, K a
// multiple of 256, scales and biases aligned to a stage's piece of them, 16-byte aligned codes and activations), the
// number of K splits, and the f32 workspace it needs when the splits are summed by a second launch (0 for one split).
struct GemmQ4Plan {
  bool covered = false;
  int row_tiles = 4;  // 16-row mma tiles per block: 1, 2 or 4
  int splits = 1;
  int chunks_per_split = 0;
  int64_t workspace_floats = 0;
};
GemmQ4Plan plan_gemm_q4(const QuantView& q, const void* x, int64_t M);

// y = x · Wᵀ (+ bias) as planned; x bf16, y f32 or bf16. The sum over K runs in a fixed order (the splits are
// added in split order), so a call's result does not vary from run to run; it is not bitwise the GEMV's.
void gemm_q4(const GemmQ4Plan& plan, const QuantView& q, const void* x, int64_t M, void* y, DType yt, const float* bias,
             float* workspace);

}  // namespace lathe::cuda
