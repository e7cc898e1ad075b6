// Gathered LoRA residuals (BGMV-style): every token of a forward reads its own adapter set's factors through a
// per-token descriptor array (or one array for all tokens), so a batch that mixes adapter sets, or none, is
// one shrink and one expand launch per group of sites sharing an input (q|k|v, gate|up), whatever the mix.
// shrink: u[t, g, r] = scale_r · (x_t · A_g[r]); expand: y[t, col0_g + n] += Σ_r u[t, g, r] · B_g[n, r], each
// output rounded once. A token's result depends only on its own row and factors, never on the batch beside it.

#include "common/env.h"
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/kernels.h"

namespace lathe::cuda {
namespace {

constexpr int kShrinkThreads = 256;
constexpr int kExpandThreads = 128;
constexpr int kPreload = 8;  // 16-byte chunks of a B row loaded before the wait (ranks up to 64 in bf16)

__device__ __forceinline__ const LoraSiteDesc* token_sites(const LoraSiteDesc* uniform,
                                                           const LoraSiteDesc* const* per_token, int64_t t) {
  return per_token ? per_token[t] : uniform;
}

// Eight products of one 16-byte chunk of bf16 pairs.
__device__ __forceinline__ float dot8_bf16(const uint4& a, const uint4& b) {
  const auto* pa = reinterpret_cast<const __nv_bfloat162*>(&a);
  const auto* pb = reinterpret_cast<const __nv_bfloat162*>(&b);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 fa = __bfloat1622float2(pa[i]), fb = __bfloat1622float2(pb[i]);
    s = fmaf(fa.x, fb.x, s);
    s = fmaf(fa.y, fb.y, s);
  }
  return s;
}

__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// One block per (rank, site, token): the block's threads split the input row, so even a 10k-wide row is a
// few loads per thread, all issued at once. The factor's row is loaded before waiting on the kernel that
// writes x (programmatic dependent launch: weights only before the wait).
template <class T>
__global__ void lora_shrink_kernel(const T* __restrict__ x, int64_t ldx, int64_t in, const LoraSiteDesc* uniform,
                                   const LoraSiteDesc* const* per_token, LoraGroup g, float* __restrict__ u, int rmax) {
  pdl_trigger();
  const int64_t t = blockIdx.z;
  const int gi = static_cast<int>(blockIdx.y);
  const int r = static_cast<int>(blockIdx.x);
  const LoraSiteDesc* sites = token_sites(uniform, per_token, t);
  const LoraSiteDesc d = sites ? sites[g.site[gi]] : LoraSiteDesc{};
  float* out = u + (t * g.n + gi) * rmax + r;
  if (r >= d.rank) {
    pdl_wait();  // u may still be read by the previous expand
    if (threadIdx.x == 0) *out = 0.f;
    return;
  }
  const T* xr = x + t * ldx;
  const T* ar = static_cast<const T*>(d.a) + static_cast<int64_t>(r) * in;
  float acc = 0.f;
  bool done = false;
  if constexpr (sizeof(T) == 2) {
    if ((in & 7) == 0 && aligned16(xr) && aligned16(ar)) {
      const auto* xv = reinterpret_cast<const uint4*>(xr);
      const auto* av = reinterpret_cast<const uint4*>(ar);
      const int64_t n8 = in / 8;
      constexpr int kAhead = 4;
      uint4 a[kAhead];
      const int64_t i0 = threadIdx.x;
#pragma unroll
      for (int k = 0; k < kAhead; ++k)
        if (i0 + k * kShrinkThreads < n8) a[k] = av[i0 + k * kShrinkThreads];
      pdl_wait();
#pragma unroll
      for (int k = 0; k < kAhead; ++k)
        if (i0 + k * kShrinkThreads < n8) acc += dot8_bf16(xv[i0 + k * kShrinkThreads], a[k]);
      for (int64_t i = i0 + kAhead * kShrinkThreads; i < n8; i += kShrinkThreads) acc += dot8_bf16(xv[i], av[i]);
      done = true;
    }
  }
  if (!done) {
    pdl_wait();
    for (int64_t i = threadIdx.x; i < in; i += kShrinkThreads) acc = fmaf(to_f(xr[i]), to_f(ar[i]), acc);
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) *out = acc * d.scale[r];
}

// One thread per output column of the group, one block row per token; the token's u rows sit in shared memory.
// The B row is loaded before waiting on the shrink.
template <class T, class Y>
__global__ void lora_expand_kernel(Y* __restrict__ y, int64_t ldy, const float* __restrict__ u, int rmax,
                                   const LoraSiteDesc* uniform, const LoraSiteDesc* const* per_token, LoraGroup g,
                                   int64_t total_cols) {
  extern __shared__ float ut[];
  pdl_trigger();
  const int64_t t = blockIdx.y;
  const LoraSiteDesc* sites = token_sites(uniform, per_token, t);
  if (!sites) {
    pdl_wait();
    return;
  }
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int gi = 0;
  int64_t n = j;
  while (gi < g.n - 1 && n >= g.cols[gi]) n -= g.cols[gi++];
  const LoraSiteDesc d = j < total_cols ? sites[g.site[gi]] : LoraSiteDesc{};
  const T* b = d.rank ? static_cast<const T*>(d.b) + n * d.rank : nullptr;
  const bool vec = sizeof(T) == 2 && (d.rank & 7) == 0 && aligned16(b);
  uint4 pre[kPreload];
  const int chunks = vec ? d.rank / 8 : 0;
#pragma unroll
  for (int k = 0; k < kPreload; ++k)
    if (k < chunks) pre[k] = reinterpret_cast<const uint4*>(b)[k];
  pdl_wait();
  for (int i = static_cast<int>(threadIdx.x); i < g.n * rmax; i += blockDim.x) ut[i] = u[t * g.n * rmax + i];
  __syncthreads();
  if (d.rank == 0) return;
  const float* ur = ut + gi * rmax;
  float acc = 0.f;
  int r0 = 0;
  if constexpr (sizeof(T) == 2) {
    if (vec) {
      for (int c = 0; c < chunks; ++c) {
        uint4 w;
        if (c < kPreload) {
#pragma unroll
          for (int k = 0; k < kPreload; ++k)
            if (k == c) w = pre[k];
        } else {
          w = reinterpret_cast<const uint4*>(b)[c];
        }
        const auto* p = reinterpret_cast<const __nv_bfloat162*>(&w);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float2 f = __bfloat1622float2(p[i]);
          acc = fmaf(ur[c * 8 + 2 * i], f.x, acc);
          acc = fmaf(ur[c * 8 + 2 * i + 1], f.y, acc);
        }
      }
      r0 = d.rank;
    }
  }
  for (int r = r0; r < d.rank; ++r) acc = fmaf(ur[r], to_f(b[r]), acc);
  Y* p = y + t * ldy + g.col0[gi] + n;
  *p = from_f<Y>(to_f(*p) + acc);
}

}  // namespace

namespace {
// While a decode step is captured, the shrink runs on a second stream beside the base GEMV (both read only x):
// fork after the kernel that writes x, join before the expand, so the graph holds the two side by side and the
// shrink leaves the step's critical path. Outside a capture a fork would cost host time on every launch; there
// the shrink goes first on the one stream, as a programmatic dependent. LATHE_LORA_FORK=0 turns the fork off.
struct SideStream {
  cudaStream_t s = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
};
SideStream& side_stream() {
  static SideStream v = [] {
    SideStream x;
    LATHE_CUDA_CHECK(cudaStreamCreateWithFlags(&x.s, cudaStreamNonBlocking));
    LATHE_CUDA_CHECK(cudaEventCreateWithFlags(&x.fork, cudaEventDisableTiming));
    LATHE_CUDA_CHECK(cudaEventCreateWithFlags(&x.join, cudaEventDisableTiming));
    return x;
  }();
  return v;
}
bool fork_enabled() {
  static const bool on = env_switch("LATHE_LORA_FORK");
  return on;
}
}  // namespace

bool lora_shrink(DType xt, const void* x, int64_t ldx, int64_t tokens, int64_t in, const LoraSiteDesc* uniform,
                 const LoraSiteDesc* const* per_token, const LoraGroup& g, int rmax, float* u) {
  if (tokens <= 0 || rmax <= 0 || g.n <= 0) return false;
  const dim3 grid(static_cast<unsigned>(rmax), static_cast<unsigned>(g.n), static_cast<unsigned>(tokens));
  SideStream& side = side_stream();  // created on first use, also outside a capture
  const bool fork = capturing() && fork_enabled();
  if (fork) {
    LATHE_CUDA_CHECK(cudaEventRecord(side.fork, stream()));
    LATHE_CUDA_CHECK(cudaStreamWaitEvent(side.s, side.fork, 0));
  }
  LATHE_DISPATCH_ACT(xt, "lora_shrink", T, {
    if (fork)
      lora_shrink_kernel<T>
          <<<grid, kShrinkThreads, 0, side.s>>>(static_cast<const T*>(x), ldx, in, uniform, per_token, g, u, rmax);
    else
      launch_dependent(lora_shrink_kernel<T>, grid, dim3(kShrinkThreads), 0, static_cast<const T*>(x), ldx, in, uniform,
                       per_token, g, u, rmax);
  });
  check_launch("lora_shrink");
  if (fork) LATHE_CUDA_CHECK(cudaEventRecord(side.join, side.s));
  return fork;
}

void lora_expand(DType ft, DType yt, void* y, int64_t ldy, int64_t tokens, const LoraSiteDesc* uniform,
                 const LoraSiteDesc* const* per_token, const LoraGroup& g, int rmax, const float* u, bool forked) {
  if (tokens <= 0 || rmax <= 0 || g.n <= 0) return;
  int64_t total = 0;
  for (int i = 0; i < g.n; ++i) total += g.cols[i];
  const dim3 grid(blocks_for(total, kExpandThreads), static_cast<unsigned>(tokens));
  const size_t smem = static_cast<size_t>(g.n) * static_cast<size_t>(rmax) * sizeof(float);
  if (forked) LATHE_CUDA_CHECK(cudaStreamWaitEvent(stream(), side_stream().join, 0));
  LATHE_DISPATCH_ACT(ft, "lora_expand", T, {
    LATHE_DISPATCH_ACT(yt, "lora_expand", Y, {
      if (forked)
        lora_expand_kernel<T, Y>
            <<<grid, kExpandThreads, smem, stream()>>>(static_cast<Y*>(y), ldy, u, rmax, uniform, per_token, g, total);
      else
        launch_dependent(lora_expand_kernel<T, Y>, grid, dim3(kExpandThreads), smem, static_cast<Y*>(y), ldy, u, rmax,
                         uniform, per_token, g, total);
    });
  });
  check_launch("lora_expand");
}

}  // namespace lathe::cuda
