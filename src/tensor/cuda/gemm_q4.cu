// Tensor-core GEMM over 4-bit MLX weights for a batched decode step's rows: the packed codes stream from DRAM into
// shared memory and are dequantized in registers, so a step reads 4.5 bits a weight instead of a dense bf16
// copy's 16.
//
// A block computes 128 outputs (4 column warps × 32) for up to 64 rows over a range of K, in stages of 256
// values staged by cp.async in a 3- or 4-deep ring (activations, codes, the stage's scales and biases); 2 or 4
// warps per column share each stage's 64-value parts and add their sums at the end. Within a part, lane t of an
// mma quad owns values 16t..16t+15 of its output row: two code words and one group's scale and bias. The mma's
// K order is permuted to match the nibble pairs that one LOP3 extracts ((i, i+4) of a word), and the
// activations are permuted the same way with PRMT, so a dot product sees each (activation, weight) pair once.
// Weights are dequantized as the dense copy is (bf16 of q·scale + bias, one rounding). When the tiles do not
// cover the SMs, K is split over blocks and a second launch adds the splits in order: deterministic.
//
// H100, Qwen3-4B shapes: 1.3-2× cuBLAS over dense bf16 copies at 16 rows, 1.05-1.6× at 32, slower at 64 and
// above, where the kernel tops out at ~200 TFLOPS (neither DRAM nor an execution unit is saturated: more warps,
// wider tiles and narrower stages did not move it; docs/benchmarks/cuda.md, session 29), so linear() uses it up
// to 32 rows.
#include <cuda_bf16.h>

#include <algorithm>

#include "common/env.h"
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/gemm_q4.h"
#include "tensor/cuda/gemv_mma_common.cuh"
#include "tensor/cuda/runtime.h"

namespace lathe::cuda {
namespace {
using mma_detail::mma16816;
using mma_detail::nib;

constexpr int kBN = 128, kChunk = 256;
constexpr int kWBytes = kBN * kChunk / 2;  // a stage's codes: 128 B of each of 128 rows

// Per stage: activations (rows × 512 B), codes, then the scales and the biases of 256 / G groups per row.
template <int MT, int G>
constexpr int stage_bytes() {
  return MT * 16 * kChunk * 2 + kWBytes + 2 * kBN * (kChunk / G) * 2;
}
// Three stages where a block holds 64 rows of activations (one block per SM), four otherwise.
template <int MT>
constexpr int stages() {
  return MT == 4 ? 3 : 4;
}
// Warps along K: each of a block's 4 column warps has kWarpsK - 1 siblings that take other 64-value parts of
// each stage (more warps to hide the shared-memory and mma latencies; registers allow 2 at 64 rows).
template <int MT>
constexpr int warps_k() {
  return MT == 4 ? 2 : 4;
}
template <int MT>
constexpr int threads() {
  return 128 * warps_k<MT>();
}

template <int B>
__device__ __forceinline__ void cp_async_small(void* dst, const void* src, bool valid) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  if constexpr (B == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0));
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(d), "l"(src), "n"(B), "r"(valid ? B : 0));
}

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

// A pair of codes as bf16 128 + q (nib's magic) to the weights q·scale + bias, rounded once.
__device__ __forceinline__ uint32_t dequant_pair(uint32_t v, __nv_bfloat162 s, __nv_bfloat162 b) {
  const __nv_bfloat162 off = __floats2bfloat162_rn(128.f, 128.f);
  __nv_bfloat162 q = *reinterpret_cast<__nv_bfloat162*>(&v);
  q = __hfma2(__hsub2(q, off), s, b);
  return *reinterpret_cast<uint32_t*>(&q);
}

template <class TY>
__device__ __forceinline__ void store_out(TY* y, int64_t i, float v) {
  y[i] = from_f<TY>(v);
}

// MT: 16-row tiles per block. G: group size. kSplit: write f32 partial sums to ws[split] instead of y.
template <int MT, int G, class TY, bool kSplit>
__global__ void __launch_bounds__(threads<MT>())
    gemm_q4_kernel(const QuantView q, const __nv_bfloat16* __restrict__ x, int M, TY* __restrict__ y,
                   const float* __restrict__ bias, float* __restrict__ ws, int chunks_per_split) {
  constexpr int BM = 16 * MT, kABytes = BM * kChunk * 2, kStages = stages<MT>(), kStage = stage_bytes<MT, G>();
  constexpr int kSBW = kChunk / G * 2;  // bytes of one row's scales (or biases) in a stage
  constexpr int kThreads = threads<MT>(), kParts = kChunk / 64 / warps_k<MT>();
  extern __shared__ __align__(16) unsigned char smem[];
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int warp = (tid >> 5) & 3, kw = tid >> 7;  // column warp, K warp
  const int N = static_cast<int>(q.rows), K = static_cast<int>(q.cols);
  const int n0 = static_cast<int>(blockIdx.x) * kBN, m0 = static_cast<int>(blockIdx.y) * BM;
  const int c_begin = static_cast<int>(blockIdx.z) * chunks_per_split;
  const int nc = min(K / kChunk, c_begin + chunks_per_split) - c_begin;
  pdl_trigger();

  const auto* scales = static_cast<const __nv_bfloat16*>(q.scales);
  const auto* biases = static_cast<const __nv_bfloat16*>(q.biases);
  // Codes, scales and biases: constants, so they may be fetched before the previous kernel ends. Each row's
  // 128 B of codes arrive whole (full lines from DRAM); 32-byte unit u of row r lands at unit u ^ (r & 3), so
  // the quads reading rows g = 0..3 of one unit hit different banks.
  auto load_w = [&](int slot, int c) {
    unsigned char* st = smem + slot * kStage + kABytes;
    for (int i = tid; i < kBN * 8; i += kThreads) {
      const int r = i >> 3, p = i & 7, n = n0 + r;
      const bool ok = n < N;
      cp_async16(st + r * 128 + (((p >> 1) ^ (r & 3)) << 5) + ((p & 1) << 4),
                 q.w + static_cast<int64_t>(ok ? n : 0) * q.w_stride + c * 32 + p * 4, ok);
    }
    for (int i = tid; i < kBN * 2; i += kThreads) {
      const int r = i >> 1, which = i & 1, n = n0 + r;
      const bool ok = n < N;
      const int64_t off = static_cast<int64_t>(ok ? n : 0) * q.sb_stride + c * (kChunk / G);
      cp_async_small<kSBW>(st + kWBytes + (which * kBN + r) * kSBW, (which ? biases : scales) + off, ok);
    }
  };
  // Activations: row r's 16-byte piece p lands at p ^ (r & 7) within its 128 bytes, so a quarter warp's reads
  // (rows g, g + 1 of a tile, pieces 2t + h) hit 8 different bank groups.
  auto load_a = [&](int slot, int c) {
    unsigned char* st = smem + slot * kStage;
    for (int i = tid; i < BM * 32; i += kThreads) {
      const int r = i >> 5, p = i & 31, m = m0 + r;
      const bool ok = m < M;
      cp_async16(st + r * (kChunk * 2) + (((p & ~7) | ((p ^ r) & 7)) << 4),
                 x + static_cast<int64_t>(ok ? m : 0) * K + c * kChunk + p * 8, ok);
    }
  };

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s)
    if (s < nc) load_w(s, c_begin + s);
  pdl_wait();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nc) load_a(s, c_begin + s);
    cp_async_commit();
  }

  float acc[MT][4][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int k = 0; k < 4; ++k) acc[i][j][k] = 0.f;

  for (int i = 0; i < nc; ++i) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    {
      const int nxt = i + kStages - 1;
      if (nxt < nc) {
        load_w(nxt % kStages, c_begin + nxt);
        load_a(nxt % kStages, c_begin + nxt);
      }
      cp_async_commit();
    }
    const unsigned char* st = smem + (i % kStages) * kStage;
    const unsigned char* sw = st + kABytes;
#pragma unroll
    for (int part = 0; part < kParts; ++part) {
      const int u = kw * kParts + part;
      // Lane t of a quad owns values 16t..16t+15 of the 64 in sub-chunk u: two code words and one group.
      const int grp = G == 32 ? 2 * u + (t >> 1) : G == 64 ? u : u >> 1;
      uint2 wv[4];
      __nv_bfloat162 s2[4], b2[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int r = warp * 32 + 8 * j + g;
        wv[j] = *reinterpret_cast<const uint2*>(sw + r * 128 + ((u ^ (r & 3)) << 5) + t * 8);
        const auto* sp = reinterpret_cast<const __nv_bfloat16*>(sw + kWBytes + r * kSBW);
        const auto* bp = reinterpret_cast<const __nv_bfloat16*>(sw + kWBytes + (kBN + r) * kSBW);
        s2[j] = __bfloat162bfloat162(sp[grp]);
        b2[j] = __bfloat162bfloat162(bp[grp]);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint4 xa[MT][2];
#pragma unroll
        for (int mi = 0; mi < MT; ++mi)
#pragma unroll
          for (int rr = 0; rr < 2; ++rr) {
            const int r = mi * 16 + g + 8 * rr;
            xa[mi][rr] =
                *reinterpret_cast<const uint4*>(st + r * (kChunk * 2) + ((u * 8 + ((2 * t + h) ^ (r & 7))) << 4));
          }
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          uint32_t b0[4], b1[4];
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const uint32_t w = h ? wv[j].y : wv[j].x;
            b0[j] = dequant_pair(nib(w, 8 * e, 0x43004300u), s2[j], b2[j]);
            b1[j] = dequant_pair(nib(w, 8 * e + 4, 0x43004300u), s2[j], b2[j]);
          }
#pragma unroll
          for (int mi = 0; mi < MT; ++mi) {
            // Values k0..k7 of the lane's 8-value piece: b0 holds codes (2e, 2e + 4), b1 (2e + 1, 2e + 5).
            const uint32_t lo0 = e ? xa[mi][0].y : xa[mi][0].x, hi0 = e ? xa[mi][0].w : xa[mi][0].z;
            const uint32_t lo1 = e ? xa[mi][1].y : xa[mi][1].x, hi1 = e ? xa[mi][1].w : xa[mi][1].z;
            const uint32_t a0 = prmt(lo0, hi0, 0x5410), a2 = prmt(lo0, hi0, 0x7632);
            const uint32_t a1 = prmt(lo1, hi1, 0x5410), a3 = prmt(lo1, hi1, 0x7632);
#pragma unroll
            for (int j = 0; j < 4; ++j) mma16816(acc[mi][j], a0, a1, a2, a3, b0[j], b1[j]);
          }
        }
      }
    }
  }

  // The K warps' sums meet in shared memory (the stages are idle now), added in K-warp order.
  if constexpr (warps_k<MT>() > 1) {
    cp_async_wait<0>();
    __syncthreads();
    float* red = reinterpret_cast<float*>(smem);
    constexpr int kAcc = MT * 16;
    if (kw > 0) {
#pragma unroll
      for (int a = 0; a < kAcc; ++a) red[((kw - 1) * 4 + warp) * kAcc * 32 + a * 32 + lane] = (&acc[0][0][0])[a];
    }
    __syncthreads();
    if (kw > 0) return;
    for (int o = 1; o < warps_k<MT>(); ++o)
#pragma unroll
      for (int a = 0; a < kAcc; ++a) (&acc[0][0][0])[a] += red[((o - 1) * 4 + warp) * kAcc * 32 + a * 32 + lane];
  }
  // Lane (g, t) holds rows g and g + 8 of each tile, columns 2t and 2t + 1 of each 8-column group.
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int m = m0 + mi * 16 + g + 8 * (k >> 1), n = n0 + warp * 32 + 8 * j + 2 * t + (k & 1);
        if (m >= M || n >= N) continue;
        const int64_t o = static_cast<int64_t>(m) * N + n;
        if constexpr (kSplit)
          ws[static_cast<int64_t>(blockIdx.z) * M * N + o] = acc[mi][j][k];
        else
          store_out(y, o, bias ? acc[mi][j][k] + bias[n] : acc[mi][j][k]);
      }
}

template <class TY>
__global__ void sum_splits_kernel(const float* __restrict__ ws, int splits, int64_t MN, int N,
                                  const float* __restrict__ bias, TY* __restrict__ y) {
  pdl_trigger();
  pdl_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= MN) return;
  float v = 0.f;
  for (int s = 0; s < splits; ++s) v += ws[s * MN + i];
  if (bias) v += bias[i % N];
  y[i] = from_f<TY>(v);
}

// LATHE_CUDA_Q4_SPLITS: a fixed split count, for comparisons (0 or unset: as planned).
int split_env() {
  static const int v = static_cast<int>(std::clamp<int64_t>(env_int("LATHE_CUDA_Q4_SPLITS", 0), 0, 1 << 20));
  return v;
}

template <int MT, int G, class TY>
void launch(const GemmQ4Plan& p, const QuantView& q, const __nv_bfloat16* x, int M, TY* y, const float* bias,
            float* ws) {
  constexpr int smem = stages<MT>() * stage_bytes<MT, G>();
  const dim3 grid(static_cast<unsigned>((q.rows + kBN - 1) / kBN), static_cast<unsigned>((M + 16 * MT - 1) / (16 * MT)),
                  static_cast<unsigned>(p.splits));
  if (p.splits == 1) {
    static const bool attr = [] {
      return cudaFuncSetAttribute(gemm_q4_kernel<MT, G, TY, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  smem) == cudaSuccess;
    }();
    (void)attr;
    launch_dependent(gemm_q4_kernel<MT, G, TY, false>, grid, dim3(threads<MT>()), smem, q, x, M, y, bias,
                     static_cast<float*>(nullptr), p.chunks_per_split);
    check_launch("gemm_q4_kernel");
    return;
  }
  static const bool attr = [] {
    return cudaFuncSetAttribute(gemm_q4_kernel<MT, G, TY, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) ==
           cudaSuccess;
  }();
  (void)attr;
  launch_dependent(gemm_q4_kernel<MT, G, TY, true>, grid, dim3(threads<MT>()), smem, q, x, M, y,
                   static_cast<const float*>(nullptr), ws, p.chunks_per_split);
  check_launch("gemm_q4_kernel");
  const int64_t mn = static_cast<int64_t>(M) * q.rows;
  launch_dependent(sum_splits_kernel<TY>, dim3(blocks_for(mn, 256)), dim3(256), 0, static_cast<const float*>(ws),
                   p.splits, mn, static_cast<int>(q.rows), bias, y);
  check_launch("sum_splits_kernel");
}

template <int MT, class TY>
void by_group(const GemmQ4Plan& p, const QuantView& q, const __nv_bfloat16* x, int M, TY* y, const float* bias,
              float* ws) {
  switch (q.group_size) {
    case 32: launch<MT, 32>(p, q, x, M, y, bias, ws); break;
    case 64: launch<MT, 64>(p, q, x, M, y, bias, ws); break;
    default: launch<MT, 128>(p, q, x, M, y, bias, ws); break;
  }
}

template <class TY>
void by_tiles(const GemmQ4Plan& p, const QuantView& q, const __nv_bfloat16* x, int M, TY* y, const float* bias,
              float* ws) {
  switch (p.row_tiles) {
    case 1: by_group<1>(p, q, x, M, y, bias, ws); break;
    case 2: by_group<2>(p, q, x, M, y, bias, ws); break;
    default: by_group<4>(p, q, x, M, y, bias, ws); break;
  }
}

bool aligned(const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

}  // namespace

GemmQ4Plan plan_gemm_q4(const QuantView& q, const void* x, int64_t M) {
  GemmQ4Plan p;
  const int64_t N = q.rows, K = q.cols;
  const bool groups_ok = q.group_size == 32 || q.group_size == 64 || q.group_size == 128;
  if (q.bits != 4 || !q.sb_bf16 || !groups_ok || K < kChunk || K % kChunk != 0 || K >= (int64_t{1} << 30) || N < 1 ||
      N >= (int64_t{1} << 30) || M < 1 || M > 4096 || M * N >= (int64_t{1} << 40))
    return p;
  // A stage's codes are 16-byte pieces of each row; its scales and biases one 4, 8 or 16-byte piece per row.
  const uintptr_t sb_piece = static_cast<uintptr_t>(kChunk / q.group_size * 2);
  if (q.w_stride % 4 != 0 || (q.sb_stride * 2) % static_cast<int64_t>(sb_piece) != 0 || !aligned(q.w, 16) ||
      !aligned(x, 16) || !aligned(q.scales, sb_piece) || !aligned(q.biases, sb_piece))
    return p;
  p.covered = true;
  p.row_tiles = M <= 16 ? 1 : M <= 32 ? 2 : 4;
  const int64_t tiles = (N + kBN - 1) / kBN * ((M + 16 * p.row_tiles - 1) / (16 * p.row_tiles));
  const int chunks = static_cast<int>(K / kChunk);
  // One block per SM is resident (shared memory at 64 rows, registers below), so the tiles are split along K
  // until one round of blocks covers the SMs, keeping ≥ 2 chunks per split (each block first waits a full
  // memory latency for its pipeline to fill). H100, Qwen3-4B shapes: within ~10% of the best fixed split count.
  int splits = static_cast<int>(std::clamp<int64_t>(sm_count() / tiles, 1, std::max(1, chunks / 2)));
  if (split_env() > 0) splits = std::min(split_env(), chunks);
  p.chunks_per_split = (chunks + splits - 1) / splits;
  p.splits = (chunks + p.chunks_per_split - 1) / p.chunks_per_split;
  p.workspace_floats = p.splits > 1 ? p.splits * M * N : 0;
  return p;
}

void gemm_q4(const GemmQ4Plan& p, const QuantView& q, const void* x, int64_t M, void* y, DType yt, const float* bias,
             float* workspace) {
  LATHE_CHECK(p.covered, "gemm_q4: the case is not covered");
  LATHE_CHECK(p.splits == 1 || workspace, "gemm_q4: split K needs a workspace");
  const auto* xb = static_cast<const __nv_bfloat16*>(x);
  const int m = static_cast<int>(M);
  if (yt == DType::BF16)
    by_tiles(p, q, xb, m, static_cast<__nv_bfloat16*>(y), bias, workspace);
  else if (yt == DType::F32)
    by_tiles(p, q, xb, m, static_cast<float*>(y), bias, workspace);
  else
    bad_dtype("gemm_q4", yt);
}

}  // namespace lathe::cuda
