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

// Folds one iteration's mma sums into a lane's two row accumulators. Lane (g, t) holds D[g][2t..2t+1] and
// D[g+8][2t..2t+1] of every row pair p; its useful ones are pair pm's, column 2t + e. The per-group scale s and
// bias b apply as acc += s·D + (b − off·s)·Σx, Σx the lane's column of dx.
__device__ __forceinline__ void fold_group_sums(const float (&d)[4][4], const float (&dx)[4], int e, int pm,
                                                const float (&s)[2], const float (&b)[2], float off, float (&acc)[2]) {
  float lo[4], hi[4];
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    lo[p] = e ? d[p][1] : d[p][0];
    hi[p] = e ? d[p][3] : d[p][2];
  }
  const float v[2] = {pm == 0   ? lo[0]
                      : pm == 1 ? lo[1]
                      : pm == 2 ? lo[2]
                                : lo[3],
                      pm == 0   ? hi[0]
                      : pm == 1 ? hi[1]
                      : pm == 2 ? hi[2]
                                : hi[3]};
  const float sx = e ? dx[1] : dx[0];
#pragma unroll
  for (int h = 0; h < 2; ++h) acc[h] = fmaf(s[h], v[h], fmaf(fmaf(-off, s[h], b[h]), sx, acc[h]));
}

// The sum over a warp's 8 slot lanes of one row's accumulator: lane (g, p) first takes pair p's sums from lane
// src = (g, (p + g/2) mod 4); the result is valid in lanes 0..3 (rows 2·lane + h).
__device__ __forceinline__ float gather_row_sum(float acc, int src) {
  float v = __shfl_sync(0xffffffffu, acc, src);
  v += __shfl_xor_sync(0xffffffffu, v, 4);
  v += __shfl_xor_sync(0xffffffffu, v, 8);
  v += __shfl_xor_sync(0xffffffffu, v, 16);
  return v;
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
