// Device helpers shared by the tensor-core GEMV kernels (gemv_mma.cu, gemv_mma_tokens.cu).
#pragma once
#include <cstdint>

#include "tensor/cuda/common.cuh"

namespace lathe::cuda::mma_detail {

__device__ __forceinline__ void mma16816(float* d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Four nibbles of w at bits s, s+16 (as bf16 pairs ((w >> s) & 0x000F000F) | magic: magic 0x4300 gives 128 + q,
// 0x4500 gives 2048 + 16·q, both exact in bf16 and in the products with bf16 activations.
// One LOP3 for mask-and-or, written out: from C, ptxas folds the magic to an immediate and then needs two (one
// immediate operand per instruction), which was 30% of the kernel's integer instructions.
__device__ __forceinline__ uint32_t nib(uint32_t w, int s, uint32_t magic) {
  uint32_t r;
  asm("lop3.b32 %0, %1, 0x000F000F, %2, 0xEA;" : "=r"(r) : "r"(w >> s), "r"(magic));
  return r;
}

template <int W>
__device__ __forceinline__ void load_words(const uint32_t* p, uint32_t* out) {
  if constexpr (W == 1) {
    out[0] = __ldg(p);
  } else if constexpr (W == 2) {
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
    out[0] = v.x;
    out[1] = v.y;
  } else {
#pragma unroll
    for (int i = 0; i < W / 4; ++i) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(p) + i);
      out[4 * i] = v.x;
      out[4 * i + 1] = v.y;
      out[4 * i + 2] = v.z;
      out[4 * i + 3] = v.w;
    }
  }
}

// Warps per block: 4, or 5 or 6 where that splits the iterations evenly and 4 does not (Qwen3-4B's K = 2560:
// 5 iterations, as 5 warps of 1 instead of 4 warps of 2, 1, 1, 1). Measured on the H200: 8 warps per block
// (fewer blocks per SM at ~100 registers) lost up to 15% on the large matrices.
inline int gemv_mma_warps(int iters) {
  int best = 4, waste = (iters + 3) / 4 * 4 - iters;
  for (int w = 5; w <= 6; ++w) {
    const int wst = (iters + w - 1) / w * w - iters;
    if (wst < waste) best = w, waste = wst;
  }
  return best;
}

}  // namespace lathe::cuda::mma_detail
