// Decode GEMV for 4- and 8-bit MLX weights with bf16 activations on the tensor cores (mma.sync m16n8k16, f32
// accumulation). The SIMT kernel in quantized.cu spends ~3.6 instructions per weight (unpack, widen, FMA);
// here a packed 4-bit word becomes four bf16 pairs in 7 instructions and one mma multiplies 256 of them
// (8-bit: each byte as two nibbles, below).
//
// Fragment mapping. Lane (g, t) = (lane / 4, lane % 4). The four lanes of g hold one quantization group
// (W = group·bits/128 words each, contiguous), quantization group gi = 8·it + g of the row. An mma's k index may be
// any permutation as long as A and B agree, so a lane's register pair is 4-bit values (j, j+4) of one word:
// ((w >> 4j) & 0x000F000F) | 0x43004300 is two bf16 numbers 128 + q. A-row g is the group from output row
// r0, A-row g+8 the same group from row r1, B column g the activations of that group (same pairing). Only the
// diagonal D[g][g], D[g+8][g] is used (lane (g, g/2)): it is Σ (128+q)·x over the group, exact products summed
// in f32, so scale and bias are applied per group in f32 as in the SIMT kernel:
//   y += s·D + (b − 128·s)·Σx,  Σx from one more mma with A = 1.
// Warps of a block split the groups of the same kRows rows (more warps in flight for few-row matrices) and meet
// in shared memory.
#include <cuda_bf16.h>

#include <cstdlib>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/gemv_mma.h"

namespace lathe::cuda {
namespace {

__device__ __forceinline__ void mma16816(float* d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Four nibbles of w at bits s, s+16 (as bf16 pairs ((w >> s) & 0x000F000F) | magic: magic 0x4300 gives 128 + q,
// 0x4500 gives 2048 + 16·q, both exact in bf16 and in the products with bf16 activations.
__device__ __forceinline__ uint32_t nib(uint32_t w, int s, uint32_t magic) { return ((w >> s) & 0x000F000Fu) | magic; }

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

__device__ __forceinline__ float sb_at(const void* p, bool bf16, int64_t i) {
  return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]) : static_cast<const float*>(p)[i];
}

// kBits 4: word k of a lane holds 8 values, taken as pairs (j, j+4) in two mma steps. kBits 8: 4 values, the
// pairs (0, 2) and (1, 3), each byte split into its low nibble (128 + lo) and high nibble (2048 + 16·hi), two
// mmas into the same sums. D = off·Σx + Σ q·x with off = 128 or 2048 + 128.
// kRows output rows per block (kRows/2 mma row pairs); kWarps warps split the groups of those rows.
template <int kBits, int W, int kRows, int kSlots, int kWarps, class TY, int kMinBlocks>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks)
    gemv_q_mma_kernel(const QuantView q, const __nv_bfloat16* __restrict__ x, TY* __restrict__ y,
                      const float* __restrict__ bias) {
  constexpr int kGroup = 128 * W / kBits;  // values per quantization group
  constexpr int kXRegs = kGroup / 8;       // bf16 pairs of x per lane per group
  constexpr float kOff = kBits == 4 ? 128.f : 2176.f;
  constexpr uint32_t kLo = 0x43004300u, kHi = 0x45004500u, kOnes = 0x3F803F80u;  // kOnes: bf16 pair (1, 1)
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int rows = static_cast<int>(q.rows);
  const int row0 = blockIdx.x * kRows;
  const int groups = static_cast<int>(q.cols / kGroup);
  const int iters = (groups + 8 * kSlots - 1) / (8 * kSlots);
  // Offsets from row0's row (the last row repeats past the end rather than branching).
  const uint32_t* wbase = q.w + row0 * q.w_stride + t * W;
  const int64_t sbbase = row0 * q.sb_stride;
  int woff[kRows], sboff[kRows];
  float acc[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int dr = min(row0 + r, rows - 1) - row0;
    woff[r] = dr * static_cast<int>(q.w_stride);
    sboff[r] = dr * static_cast<int>(q.sb_stride);
    acc[r] = 0.f;
  }
  const bool odd = g & 1;
  // One iteration: all loads first, then the math.
  struct Stage {
    int gc[kSlots];
    uint32_t wv[kSlots][kRows][W];
    uint32_t xr[kSlots][kXRegs];
    float s[kSlots][kRows], b[kSlots][kRows];
  };
  auto load = [&](int it, Stage& st) {
#pragma unroll
    for (int sl = 0; sl < kSlots; ++sl) {
      const int gi = (it * kSlots + sl) * 8 + g;
      const bool valid = gi < groups;
      st.gc[sl] = valid ? gi : groups - 1;  // tail lanes read a real group and multiply it by x = 0
#pragma unroll
      for (int r = 0; r < kRows; ++r) load_words<W>(wbase + woff[r] + st.gc[sl] * W * 4, st.wv[sl][r]);
      const uint4* xs4 = reinterpret_cast<const uint4*>(x + st.gc[sl] * kGroup + t * (kGroup / 4));
#pragma unroll
      for (int i = 0; i < kXRegs / 4; ++i) {
        uint4 v = __ldg(xs4 + i);
        if (!valid) v = make_uint4(0, 0, 0, 0);
        st.xr[sl][4 * i] = v.x;
        st.xr[sl][4 * i + 1] = v.y;
        st.xr[sl][4 * i + 2] = v.z;
        st.xr[sl][4 * i + 3] = v.w;
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        st.s[sl][r] = sb_at(q.scales, q.sb_bf16, sbbase + sboff[r] + st.gc[sl]);
        st.b[sl][r] = sb_at(q.biases, q.sb_bf16, sbbase + sboff[r] + st.gc[sl]);
      }
    }
  };
  auto compute = [&](const Stage& st) {
#pragma unroll
    for (int sl = 0; sl < kSlots; ++sl) {
      float dx[4] = {0.f, 0.f, 0.f, 0.f};
      float d[kRows / 2][4];
#pragma unroll
      for (int p = 0; p < kRows / 2; ++p) d[p][0] = d[p][1] = d[p][2] = d[p][3] = 0.f;
#pragma unroll
      for (int k = 0; k < W; ++k) {
        if constexpr (kBits == 4) {
          const uint32_t* r = st.xr[sl] + 4 * k;  // x0..x7 as (x0,x1) (x2,x3) (x4,x5) (x6,x7) -> (xj, xj+4)
          const uint32_t xp[4] = {__byte_perm(r[0], r[2], 0x5410), __byte_perm(r[0], r[2], 0x7632),
                                  __byte_perm(r[1], r[3], 0x5410), __byte_perm(r[1], r[3], 0x7632)};
#pragma unroll
          for (int m = 0; m < 2; ++m) {
            mma16816(dx, kOnes, kOnes, kOnes, kOnes, xp[2 * m], xp[2 * m + 1]);
#pragma unroll
            for (int p = 0; p < kRows / 2; ++p) {
              const uint32_t a = st.wv[sl][2 * p][k], c = st.wv[sl][2 * p + 1][k];
              mma16816(d[p], nib(a, 8 * m, kLo), nib(c, 8 * m, kLo), nib(a, 8 * m + 4, kLo), nib(c, 8 * m + 4, kLo),
                       xp[2 * m], xp[2 * m + 1]);
            }
          }
        } else {
          const uint32_t* r = st.xr[sl] + 2 * k;  // x0..x3 as (x0,x1) (x2,x3) -> (x0,x2) (x1,x3)
          const uint32_t x02 = __byte_perm(r[0], r[1], 0x5410), x13 = __byte_perm(r[0], r[1], 0x7632);
          mma16816(dx, kOnes, kOnes, kOnes, kOnes, x02, x13);
#pragma unroll
          for (int p = 0; p < kRows / 2; ++p) {
            const uint32_t a = st.wv[sl][2 * p][k], c = st.wv[sl][2 * p + 1][k];
            mma16816(d[p], nib(a, 0, kLo), nib(c, 0, kLo), nib(a, 8, kLo), nib(c, 8, kLo), x02, x13);
            mma16816(d[p], nib(a, 4, kHi), nib(c, 4, kHi), nib(a, 12, kHi), nib(c, 12, kHi), x02, x13);
          }
        }
      }
      const float sx = odd ? dx[1] : dx[0];
#pragma unroll
      for (int p = 0; p < kRows / 2; ++p) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = 2 * p + h;
          const float dv = odd ? d[p][2 * h + 1] : d[p][2 * h];
          acc[r] = fmaf(st.s[sl][r], dv, fmaf(fmaf(-kOff, st.s[sl][r], st.b[sl][r]), sx, acc[r]));
        }
      }
    }
  };
  // A register double buffer (next iteration's loads before this one's math) measured slower: the extra
  // registers cost more occupancy than the overlap gained.
  for (int it = warp; it < iters; it += kWarps) {
    Stage st;
    load(it, st);
    compute(st);
  }
  // Lane (g, g/2) holds group slot g's sums; the others hold products of mismatched columns.
  __shared__ float part[kWarps][kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float v = warp_sum(t == (g >> 1) ? acc[r] : 0.f);
    if (lane == 0) part[warp][r] = v;
  }
  __syncthreads();
  if (threadIdx.x < kRows) {
    const int n = row0 + threadIdx.x;
    float v = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) v += part[w][threadIdx.x];
    if (n < rows) y[n] = from_f<TY>(bias ? v + bias[n] : v);
  }
}

// Tuned on the H200 (4096×14336, 14336×4096, 19456×2560, 6144×2560, 2560×9728; groups 32/64/128): 8 rows per
// block, 4 warps, one group per lane per iteration, registers capped for 4 blocks per SM (16 warps). More
// groups per lane (kSlots), more rows or a tighter register cap (5+ blocks, spills) were slower.
template <int kBits, int W, class TY, int kRows = 8, int kSlots = 1, int kWarps = 4, int kMinBlocks = 4>
void launch(const QuantView& q, const __nv_bfloat16* x, TY* y, const float* bias) {
  const unsigned blocks = static_cast<unsigned>((q.rows + kRows - 1) / kRows);
  gemv_q_mma_kernel<kBits, W, kRows, kSlots, kWarps, TY, kMinBlocks>
      <<<blocks, kWarps * 32, 0, stream()>>>(q, x, y, bias);
}

template <class TY>
bool dispatch(const QuantView& q, const __nv_bfloat16* x, TY* y, const float* bias) {
  switch (q.bits * 1000 + q.group_size) {
    case 4032: launch<4, 1>(q, x, y, bias); return true;
    case 4064: launch<4, 2>(q, x, y, bias); return true;
    case 4128: launch<4, 4>(q, x, y, bias); return true;
    case 8032: launch<8, 2>(q, x, y, bias); return true;
    case 8064: launch<8, 4>(q, x, y, bias); return true;
    case 8128: launch<8, 8>(q, x, y, bias); return true;
    default: return false;
  }
}

constexpr int64_t kMaxRows8 = 8192;

}  // namespace

bool gemv_q_mma(const QuantView& q, const void* x, DType xt, void* y, DType yt, const float* bias) {
  static const bool off = [] {  // LATHE_CUDA_GEMV_MMA=0: the SIMT kernel, for comparisons
    const char* e = std::getenv("LATHE_CUDA_GEMV_MMA");
    return e && e[0] == '0';
  }();
  // Measured on the H200 against the SIMT kernel: on matrices with few rows (o_proj, down_proj: 2560–4096 rows,
  // where the SIMT kernel has too few warps per SM) this one is 17–33% faster; on 9728+ rows 4-bit is within
  // −7…+16% (decode tok/s the same either way) and 8-bit loses up to 24%, so 8-bit stays SIMT there.
  if (off || xt != DType::BF16 || (q.bits == 8 && q.rows >= kMaxRows8)) return false;
  const auto* xb = static_cast<const __nv_bfloat16*>(x);
  if (yt == DType::BF16) return dispatch(q, xb, static_cast<__nv_bfloat16*>(y), bias);
  if (yt == DType::F32) return dispatch(q, xb, static_cast<float*>(y), bias);
  return false;
}

}  // namespace lathe::cuda
