// The 4-bit tensor-core GEMV (gemv_mma.cu) over several tokens per block: a batched decode step's linears.
//
// The one-token kernel spends most of its instructions unpacking nibbles into bf16 pairs; with T tokens per
// block each stage's weights are unpacked once into registers and then multiplied with every token's
// activations. Each token runs exactly the one-token kernel's operations on exactly its inputs — the same
// mma calls with the same A and B fragments, in the same order, the same per-group scale/bias folding, the same
// shuffles and the same warp-order sum — so a token's output is bitwise what a one-token call gives it, however
// many tokens share the launch (batched greedy equals solo greedy at any batch size the limit allows). The mma
// count per token is unchanged (the kernel uses the diagonal of each mma, see gemv_mma.cu), so this kernel
// saves the unpacking and the weight traffic, not the tensor-core work.
#include <cuda_bf16.h>

#include <type_traits>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/gemv_mma.h"
#include "tensor/cuda/gemv_mma_common.cuh"

namespace lathe::cuda {
namespace {
using namespace mma_detail;

constexpr int kMaxWarps = 8;

// W: words per lane per group (1: group 32, 2: group 64). kT: tokens per block. Grid: row blocks × token
// groups, the token group fastest (the blocks reading one set of weight rows run together).
template <int W, bool kSbBf16, class TY, int kT>
__global__ void __launch_bounds__(kMaxWarps * 32, 1)
    gemv_q4_tokens_kernel(const QuantView q, const __nv_bfloat16* __restrict__ x, TY* __restrict__ y,
                          const float* __restrict__ bias, int tokens) {
  using SB = std::conditional_t<kSbBf16, __nv_bfloat16, float>;
  constexpr int kRows = 8;
  constexpr int kGroup = 32 * W;  // 4-bit: values per group
  constexpr int kGroupWords = W * 4;
  constexpr int kXRegs = kGroup / 8;
  constexpr float kOff = 128.f;
  constexpr uint32_t magic_lo = 0x43004300u, ones = 0x3F803F80u;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3, e = g & 1;
  const int rows = static_cast<int>(q.rows);
  const int nwarps = static_cast<int>(blockDim.x >> 5);
  const int token_groups = (tokens + kT - 1) / kT;
  const int tok0 = static_cast<int>(blockIdx.x) % token_groups * kT;
  const int nt = min(kT, tokens - tok0);
  const int row0 = static_cast<int>(blockIdx.x) / token_groups * kRows;
  const int groups = static_cast<int>(q.cols / kGroup);
  const int pm = (t - (g >> 1)) & 3;
  __shared__ float part[kT][kMaxWarps][kRows];
  pdl_trigger();
  float acc[kT][2];
#pragma unroll
  for (int j = 0; j < kT; ++j) acc[j][0] = acc[j][1] = 0.f;

  const uint32_t* wbase = q.w + static_cast<int64_t>(row0) * q.w_stride;
  const SB* sbase = static_cast<const SB*>(q.scales) + static_cast<int64_t>(row0) * q.sb_stride;
  const SB* bbase = static_cast<const SB*>(q.biases) + static_cast<int64_t>(row0) * q.sb_stride;
  int woff[kRows];
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

  struct Weights {
    uint32_t wv[kRows][W];
    float s[2], b[2];
  };
  auto load_w = [&](int it, bool tail, Weights& st) {
    const int gb = it * 8;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int slot = 2 * (((g >> 1) + r / 2) & 3) + e;
      const int shift = tail ? (min(gb + slot, groups - 1) - slot) * kGroupWords : gb * kGroupWords;
      load_words<W>(wbase + woff[r] + shift, st.wv[r]);
    }
    const int gs = tail ? min(gb + 2 * t + e, groups - 1) - (2 * t + e) : gb;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      st.s[h] = to_f(__ldg(sbase + (sboff[h] + gs)));
      st.b[h] = to_f(__ldg(bbase + (sboff[h] + gs)));
    }
  };
  // Token j's activations of iteration `it` (a tail's missing slots read 0, as the one-token kernel).
  auto load_x = [&](int it, bool tail, int j, uint32_t* xr) {
    const int gb = it * 8;
    const bool xvalid = !tail || gb + g < groups;
    const __nv_bfloat16* xt = x + static_cast<int64_t>(tok0 + j) * q.cols;
    const uint4* xs4 = reinterpret_cast<const uint4*>(xt + (xoff + (xvalid ? gb : 0) * kGroup));
#pragma unroll
    for (int i = 0; i < kXRegs / 4; ++i) {
      const uint4 v = xvalid ? __ldg(xs4 + i) : make_uint4(0, 0, 0, 0);
      xr[4 * i] = v.x;
      xr[4 * i + 1] = v.y;
      xr[4 * i + 2] = v.z;
      xr[4 * i + 3] = v.w;
    }
  };
  auto stage = [&](int it, bool tail, bool first) {
    Weights st;
    load_w(it, tail, st);
    if (first) pdl_wait();
    uint32_t ua[W][2][4][4];  // the unpacked A fragments, shared by all tokens
#pragma unroll
    for (int k = 0; k < W; ++k)
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int p = 0; p < 4; ++p) {
          const uint32_t a = st.wv[2 * p][k], c = st.wv[2 * p + 1][k];
          ua[k][m][p][0] = nib(a, 8 * m, magic_lo);
          ua[k][m][p][1] = nib(c, 8 * m, magic_lo);
          ua[k][m][p][2] = nib(a, 8 * m + 4, magic_lo);
          ua[k][m][p][3] = nib(c, 8 * m + 4, magic_lo);
        }
#pragma unroll
    for (int j = 0; j < kT; ++j) {
      if (j >= nt) break;
      uint32_t xr[kXRegs];
      load_x(it, tail, j, xr);
      float dx[4] = {0.f, 0.f, 0.f, 0.f};
      float d[4][4];
#pragma unroll
      for (int p = 0; p < 4; ++p) d[p][0] = d[p][1] = d[p][2] = d[p][3] = 0.f;
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const uint32_t* r = xr + 4 * k;
        const uint32_t xp[4] = {__byte_perm(r[0], r[2], 0x5410), __byte_perm(r[0], r[2], 0x7632),
                                __byte_perm(r[1], r[3], 0x5410), __byte_perm(r[1], r[3], 0x7632)};
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          mma16816(dx, ones, ones, ones, ones, xp[2 * m], xp[2 * m + 1]);
#pragma unroll
          for (int p = 0; p < 4; ++p)
            mma16816(d[p], ua[k][m][p][0], ua[k][m][p][1], ua[k][m][p][2], ua[k][m][p][3], xp[2 * m], xp[2 * m + 1]);
        }
      }
      fold_group_sums(d, dx, e, pm, st.s, st.b, kOff, acc[j]);
    }
  };
  const int full = groups / 8, iters = (groups + 7) / 8;
  int it = warp;
  if (it < full) {
    stage(it, false, true);
    it += nwarps;
  } else {
    pdl_wait();
  }
  for (; it < full; it += nwarps) stage(it, false, false);
  if (it < iters) stage(it, true, false);

  const int src = (g << 2) | ((t + (g >> 1)) & 3);
#pragma unroll
  for (int j = 0; j < kT; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float v = gather_row_sum(acc[j][h], src);
      if (lane < 4) part[j][warp][2 * lane + h] = v;
    }
  }
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.x); i < nt * kRows; i += static_cast<int>(blockDim.x)) {
    const int j = i / kRows, r = i % kRows, n = row0 + r;
    float v = 0.f;
    for (int w = 0; w < nwarps; ++w) v += part[j][w][r];
    if (n < rows) y[static_cast<int64_t>(tok0 + j) * q.rows + n] = from_f<TY>(bias ? v + bias[n] : v);
  }
}

template <int W, class TY, int kT>
void launch(const QuantView& q, const __nv_bfloat16* x, TY* y, const float* bias, int tokens) {
  constexpr int kGroup = 32 * W;
  const int iters = static_cast<int>((q.cols / kGroup + 7) / 8);
  const unsigned blocks = static_cast<unsigned>((q.rows + 7) / 8 * ((tokens + kT - 1) / kT));
  const unsigned threads = static_cast<unsigned>(32 * gemv_mma_warps(iters));
  if (q.sb_bf16)
    launch_dependent(gemv_q4_tokens_kernel<W, true, TY, kT>, blocks, threads, 0, q, x, y, bias, tokens);
  else
    launch_dependent(gemv_q4_tokens_kernel<W, false, TY, kT>, blocks, threads, 0, q, x, y, bias, tokens);
}

template <class TY>
bool dispatch(const QuantView& q, const __nv_bfloat16* x, TY* y, const float* bias, int tokens, int per_block) {
  const bool four = per_block <= 4;
  switch (q.group_size) {
    case 32: four ? launch<1, TY, 4>(q, x, y, bias, tokens) : launch<1, TY, 8>(q, x, y, bias, tokens); return true;
    case 64: four ? launch<2, TY, 4>(q, x, y, bias, tokens) : launch<2, TY, 8>(q, x, y, bias, tokens); return true;
    default: return false;
  }
}

}  // namespace

bool gemv_q_mma_tokens_covers(const QuantView& q) { return q.bits == 4 && (q.group_size == 32 || q.group_size == 64); }

bool gemv_q_mma_tokens(const QuantView& q, const void* x, void* y, DType yt, const float* bias, int64_t tokens,
                       int per_block) {
  if (!gemv_q_mma_tokens_covers(q) || tokens < 2 || tokens >= (int64_t{1} << 24) ||
      (q.rows + 7) / 8 * ((tokens + 7) / 8) >= (int64_t{1} << 31))
    return false;
  const auto* xb = static_cast<const __nv_bfloat16*>(x);
  const int n = static_cast<int>(tokens);
  if (yt == DType::BF16) return dispatch(q, xb, static_cast<__nv_bfloat16*>(y), bias, n, per_block);
  if (yt == DType::F32) return dispatch(q, xb, static_cast<float*>(y), bias, n, per_block);
  return false;
}

}  // namespace lathe::cuda
