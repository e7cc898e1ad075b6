// Decode GEMV for 4- and 8-bit MLX weights with bf16 activations on the tensor cores (mma.sync m16n8k16, f32
// accumulation). The SIMT kernel in quantized.cu spends ~3.6 instructions per weight (unpack, widen, FMA);
// here a packed 4-bit word becomes four bf16 pairs in 7 instructions (4 LOP3 + 3 shifts) and one mma
// multiplies 256 of them (8-bit: each byte as two nibbles, below).
//
// Fragment mapping. Lane (g, t) = (lane / 4, lane % 4). The four lanes of g hold one quantization group
// (W = group·bits/128 words each, contiguous). An mma's k index may be any permutation as long as A and B agree,
// so a lane's register pair is 4-bit values (j, j+4) of one word: ((w >> 4j) & 0x000F000F) | 0x43004300 is two
// bf16 numbers 128 + q. A-rows g and g+8 hold the same group of two output rows, B column j the activations of
// group slot j. Only diagonal entries (A-row group == B-column group) are used: each is Σ (128+q)·x over one
// group, exact products summed in f32, so scale and bias are applied per group in f32 as in the SIMT kernel:
//   y += s·D + (b − 128·s)·Σx,  Σx from one more mma with A = 1.
// Which group each A-row takes is rotated per row pair (below) so every lane receives useful sums.
#include <cuda_bf16.h>

#include <algorithm>
#include <type_traits>

#include "common/env.h"
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/gemv_mma.h"
#include "tensor/cuda/gemv_mma_common.cuh"

namespace lathe::cuda {
namespace {
using namespace mma_detail;

// kBits 4: word k of a lane holds 8 values, taken as pairs (j, j+4) in two mma steps. kBits 8: 4 values, the
// pairs (0, 2) and (1, 3), each byte split into its low nibble (128 + lo) and high nibble (2048 + 16·hi), two
// mmas into the same sums. D = off·Σx + Σ q·x with off = 128 or 2048 + 128.
//
// Slot rotation. A warp takes 8 groups (slots) of 8 rows (4 row pairs p) per iteration; B column j is the
// activations of slot j. For pair p, A-rows g and g+8 are rows 2p and 2p+1 at slot σ_p(g) = 2·((g/2 + p) mod 4)
// + g mod 2, so the useful diagonal entry D[g][σ_p(g)] lands in lane (g, (g/2 + p) mod 4): every lane gets the
// sums of exactly one (row pair, slot) per iteration, and scale and bias are applied for 2 rows per lane
// instead of 8 rows on a quarter of the lanes.
// A block is one set of 8 rows of one token; its warps (blockDim.x / 32, chosen by the host) split the
// iterations. With several tokens (x [tokens, K], y [tokens, N]) the token index varies fastest over the grid, so
// the blocks reading one set of weight rows run together and all but the first find them in L2; each token's
// result is computed exactly as a one-token launch computes it (same blocks, lanes and summation order), so a row's
// output never depends on how many tokens share the launch.
template <int kBits, int W, bool kSbBf16, class TY, int kMaxWarps, int kMinBlocks>
__global__ void __launch_bounds__(kMaxWarps * 32, kMinBlocks)
    gemv_q_mma_kernel(const QuantView q, const __nv_bfloat16* __restrict__ x, TY* __restrict__ y,
                      const float* __restrict__ bias, int tokens) {
  using SB = std::conditional_t<kSbBf16, __nv_bfloat16, float>;
  constexpr int kRows = 8;                 // rows per block (4 mma row pairs)
  constexpr int kGroup = 128 * W / kBits;  // values per quantization group
  constexpr int kGroupWords = kGroup * kBits / 32;
  constexpr int kXRegs = kGroup / 8;  // bf16 pairs of x per lane per group
  constexpr float kOff = kBits == 4 ? 128.f : 2176.f;
  constexpr uint32_t magic_lo = 0x43004300u, magic_hi = 0x45004500u, ones = 0x3F803F80u;  // ones: bf16 (1, 1)
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3, e = g & 1;
  const int rows = static_cast<int>(q.rows);
  const int nwarps = static_cast<int>(blockDim.x >> 5);
  const int token = static_cast<int>(blockIdx.x) % tokens;
  const int row0 = static_cast<int>(blockIdx.x) / tokens * kRows;
  x += static_cast<int64_t>(token) * q.cols;
  y += static_cast<int64_t>(token) * q.rows;
  const int groups = static_cast<int>(q.cols / kGroup);
  const int pm = (t - (g >> 1)) & 3;  // the row pair whose sums this lane receives, at slot 2t + e
  __shared__ float part[kMaxWarps][kRows];
  pdl_trigger();
  float acc[2] = {0.f, 0.f};
  if (row0 < rows) {
    // Everything below is a 32-bit offset from a warp-uniform base, advanced by a uniform step per iteration:
    // address math stays off the integer pipe, which the nibble unpacking keeps busy.
    const uint32_t* wbase = q.w + static_cast<int64_t>(row0) * q.w_stride;
    const SB* sbase = static_cast<const SB*>(q.scales) + static_cast<int64_t>(row0) * q.sb_stride;
    const SB* bbase = static_cast<const SB*>(q.biases) + static_cast<int64_t>(row0) * q.sb_stride;
    const __nv_bfloat16* xbase = x;
    // Opaque to the optimizer: otherwise it re-adds row0's offset to the raw pointer at every load in 64-bit
    // steps, where a fixed base takes one wide multiply-add per address.
    asm("" : "+l"(wbase), "+l"(sbase), "+l"(bbase), "+l"(xbase));
    int woff[kRows];  // row r at slot σ_{r/2}(g), lane t's words (the last row repeats past the end)
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      woff[r] = (min(row0 + r, rows - 1) - row0) * static_cast<int>(q.w_stride) +
                (2 * (((g >> 1) + r / 2) & 3) + e) * kGroupWords + t * W;
    uint32_t sboff[2];
#pragma unroll
    for (int h = 0; h < 2; ++h)
      sboff[h] =
          static_cast<uint32_t>((min(row0 + 2 * pm + h, rows - 1) - row0) * static_cast<int>(q.sb_stride) + 2 * t + e);
    const uint32_t xoff = static_cast<uint32_t>(g * kGroup + t * (kGroup / 4));
    struct Stage {
      uint32_t wv[kRows][W];
      uint32_t xr[kXRegs];
      float s[2], b[2];
    };
    // A full iteration (all 8 slots inside the row) needs no clamping. Weights and scales never depend on the
    // previous kernel; x does (see pdl_wait below).
    auto load_w = [&](int it, Stage& st) {
      const int gb = it * 8;  // one int index per load: a single wide multiply-add forms each address
#pragma unroll
      for (int r = 0; r < kRows; ++r) load_words<W>(wbase + (woff[r] + gb * kGroupWords), st.wv[r]);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        st.s[h] = to_f(__ldg(sbase + (sboff[h] + gb)));
        st.b[h] = to_f(__ldg(bbase + (sboff[h] + gb)));
      }
    };
    auto load_x = [&](int it, Stage& st) {
      const uint4* xs4 = reinterpret_cast<const uint4*>(xbase + (xoff + it * 8 * kGroup));
#pragma unroll
      for (int i = 0; i < kXRegs / 4; ++i) {
        const uint4 v = __ldg(xs4 + i);
        st.xr[4 * i] = v.x;
        st.xr[4 * i + 1] = v.y;
        st.xr[4 * i + 2] = v.z;
        st.xr[4 * i + 3] = v.w;
      }
    };
    // The last, partial iteration: missing slots read the row's last group, with x = 0 (so they add 0).
    auto load_tail = [&](int it, Stage& st) {
      const int gb = it * 8;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int slot = 2 * (((g >> 1) + r / 2) & 3) + e;
        const int shift = (min(gb + slot, groups - 1) - slot) * kGroupWords;
        load_words<W>(wbase + woff[r] + shift, st.wv[r]);
      }
      const bool xvalid = gb + g < groups;
      const uint4* xs4 = reinterpret_cast<const uint4*>(xbase + (xoff + (xvalid ? gb : 0) * kGroup));
#pragma unroll
      for (int i = 0; i < kXRegs / 4; ++i) {
        const uint4 v = xvalid ? __ldg(xs4 + i) : make_uint4(0, 0, 0, 0);
        st.xr[4 * i] = v.x;
        st.xr[4 * i + 1] = v.y;
        st.xr[4 * i + 2] = v.z;
        st.xr[4 * i + 3] = v.w;
      }
      const int gs = min(gb + 2 * t + e, groups - 1) - (2 * t + e);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        st.s[h] = to_f(__ldg(sbase + (sboff[h] + gs)));
        st.b[h] = to_f(__ldg(bbase + (sboff[h] + gs)));
      }
    };
    auto compute = [&](const Stage& st) {
      float dx[4] = {0.f, 0.f, 0.f, 0.f};
      float d[4][4];
#pragma unroll
      for (int p = 0; p < 4; ++p) d[p][0] = d[p][1] = d[p][2] = d[p][3] = 0.f;
#pragma unroll
      for (int k = 0; k < W; ++k) {
        if constexpr (kBits == 4) {
          const uint32_t* r = st.xr + 4 * k;  // x0..x7 as (x0,x1) (x2,x3) (x4,x5) (x6,x7) -> (xj, xj+4)
          const uint32_t xp[4] = {__byte_perm(r[0], r[2], 0x5410), __byte_perm(r[0], r[2], 0x7632),
                                  __byte_perm(r[1], r[3], 0x5410), __byte_perm(r[1], r[3], 0x7632)};
#pragma unroll
          for (int m = 0; m < 2; ++m) {
            mma16816(dx, ones, ones, ones, ones, xp[2 * m], xp[2 * m + 1]);
#pragma unroll
            for (int p = 0; p < 4; ++p) {
              const uint32_t a = st.wv[2 * p][k], c = st.wv[2 * p + 1][k];
              mma16816(d[p], nib(a, 8 * m, magic_lo), nib(c, 8 * m, magic_lo), nib(a, 8 * m + 4, magic_lo),
                       nib(c, 8 * m + 4, magic_lo), xp[2 * m], xp[2 * m + 1]);
            }
          }
        } else {
          const uint32_t* r = st.xr + 2 * k;  // x0..x3 as (x0,x1) (x2,x3) -> (x0,x2) (x1,x3)
          const uint32_t x02 = __byte_perm(r[0], r[1], 0x5410), x13 = __byte_perm(r[0], r[1], 0x7632);
          mma16816(dx, ones, ones, ones, ones, x02, x13);
#pragma unroll
          for (int p = 0; p < 4; ++p) {
            const uint32_t a = st.wv[2 * p][k], c = st.wv[2 * p + 1][k];
            mma16816(d[p], nib(a, 0, magic_lo), nib(c, 0, magic_lo), nib(a, 8, magic_lo), nib(c, 8, magic_lo), x02,
                     x13);
            mma16816(d[p], nib(a, 4, magic_hi), nib(c, 4, magic_hi), nib(a, 12, magic_hi), nib(c, 12, magic_hi), x02,
                     x13);
          }
        }
      }
      fold_group_sums(d, dx, e, pm, st.s, st.b, kOff, acc);
    };
    const int full = groups / 8, iters = (groups + 7) / 8;
    int it = warp;
    // Launched as a programmatic dependent: the first iteration's weights are requested while the kernel that
    // writes x may still run (its DRAM round trip is the one no warp can otherwise hide); x only after the wait.
    {
      Stage st;
      const bool first = it < full;
      if (first) load_w(it, st);
      pdl_wait();
      if (first) {
        load_x(it, st);
        compute(st);
        it += nwarps;
      }
    }
    for (; it < full; it += nwarps) {
      Stage st;
      load_w(it, st);
      load_x(it, st);
      compute(st);
    }
    if (it < iters) {
      Stage st;
      load_tail(it, st);
      compute(st);
    }
  }
  if (row0 >= rows) pdl_wait();  // (never: the grid has no block past the rows; every thread waits before writing)
  // Gather: lane (g, p) takes pair p's sums from lane (g, (p + g/2) mod 4), then the 8 slot lanes add up.
  const int src = (g << 2) | ((t + (g >> 1)) & 3);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float v = gather_row_sum(acc[h], src);
    if (lane < 4) part[warp][2 * lane + h] = v;
  }
  __syncthreads();
  if (threadIdx.x < kRows) {
    const int n = row0 + static_cast<int>(threadIdx.x);
    float v = 0.f;
    for (int w = 0; w < nwarps; ++w) v += part[w][threadIdx.x];
    if (n < rows) y[n] = from_f<TY>(bias ? v + bias[n] : v);
  }
}

template <int kBits, int W, class TY>
void launch(const QuantView& q, const __nv_bfloat16* x, TY* y, const float* bias, int tokens) {
  constexpr int kGroup = 128 * W / kBits;
  const int iters = static_cast<int>((q.cols / kGroup + 7) / 8);
  const unsigned blocks = static_cast<unsigned>((q.rows + 7) / 8 * tokens);
  const unsigned threads = static_cast<unsigned>(32 * gemv_mma_warps(iters));
  if (q.sb_bf16)
    launch_dependent(gemv_q_mma_kernel<kBits, W, true, TY, 8, 2>, blocks, threads, 0, q, x, y, bias, tokens);
  else
    launch_dependent(gemv_q_mma_kernel<kBits, W, false, TY, 8, 2>, blocks, threads, 0, q, x, y, bias, tokens);
}

template <class TY>
bool dispatch(const QuantView& q, const __nv_bfloat16* x, TY* y, const float* bias, int tokens) {
  switch (q.bits * 1000 + q.group_size) {
    case 4032: launch<4, 1>(q, x, y, bias, tokens); return true;
    case 4064: launch<4, 2>(q, x, y, bias, tokens); return true;
    case 4128: launch<4, 4>(q, x, y, bias, tokens); return true;
    case 8032: launch<8, 2>(q, x, y, bias, tokens); return true;
    case 8064: launch<8, 4>(q, x, y, bias, tokens); return true;
    case 8128: launch<8, 8>(q, x, y, bias, tokens); return true;
    default: return false;
  }
}

constexpr int64_t kMaxRows8 = 8192;

}  // namespace

bool gemv_q_mma(const QuantView& q, const void* x, DType xt, void* y, DType yt, const float* bias, int64_t tokens) {
  static const bool off = !env_switch("LATHE_CUDA_GEMV_MMA");  // =0: the SIMT kernel, for comparisons
  // Measured on the H200 against the SIMT kernel: faster on every 4-bit shape and on 8-bit matrices of few rows;
  // 8-bit on 8192+ rows is mixed (14336×4096: 63% of copy bandwidth against the SIMT kernel's 74%; 19456×2560:
  // 67% against 63%), so 8-bit stays SIMT there.
  if (off || xt != DType::BF16 || (q.bits == 8 && q.rows >= kMaxRows8) || tokens < 1 ||
      (q.rows + 7) / 8 * tokens >= (int64_t{1} << 31))
    return false;
  // Several tokens of 4-bit weights: unpacked once per block for up to 8 tokens (gemv_mma_tokens.cu), each
  // token's result still bitwise its one-token call's. LATHE_CUDA_GEMV_TOKENS=1: one token per block, as before.
  static const int per_block = static_cast<int>(std::clamp<int64_t>(env_int("LATHE_CUDA_GEMV_TOKENS", 8), 0, 64));
  if (tokens > 1 && per_block > 1 && gemv_q_mma_tokens(q, x, y, yt, bias, tokens, per_block)) return true;
  const auto* xb = static_cast<const __nv_bfloat16*>(x);
  const int n = static_cast<int>(tokens);
  if (yt == DType::BF16) return dispatch(q, xb, static_cast<__nv_bfloat16*>(y), bias, n);
  if (yt == DType::F32) return dispatch(q, xb, static_cast<float*>(y), bias, n);
  return false;
}

}  // namespace lathe::cuda
