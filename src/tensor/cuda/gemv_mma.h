// Tensor-core decode GEMV for 4- and 8-bit weights with bf16 activations (gemv_mma.cu).
#pragma once
#include "tensor/cuda/kernels.h"

namespace lathe::cuda {

// y[N] = W·x (+ bias) when the case is covered (4 or 8 bits, group 32/64/128, bf16 x, f32/bf16 y; 8-bit below 8192
// rows); false otherwise (nothing launched), and the caller runs the SIMT kernel. tokens > 1: x [tokens, K] and
// y [tokens, N] row by row, each token's row bit-identical to a one-token call, weights read from DRAM ~once.
bool gemv_q_mma(const QuantView& q, const void* x, DType xt, void* y, DType yt, const float* bias, int64_t tokens = 1);

// The 4-bit GEMV over tokens ≥ 2 with the weights unpacked once per block for up to `per_block` (4 or 8)
// tokens; every token's row bitwise what gemv_q_mma gives it alone. False where not covered (bf16 x only).
bool gemv_q_mma_tokens_covers(const QuantView& q);
bool gemv_q_mma_tokens(const QuantView& q, const void* x, void* y, DType yt, const float* bias, int64_t tokens,
                       int per_block);

}  // namespace lathe::cuda
