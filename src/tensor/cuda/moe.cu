// Mixture-of-experts routing on the device: the router's softmax + top-k + renormalisation (one warp per token),
// and the row gather / weighted scatter-add that move tokens to and from their experts.
#include <cfloat>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/kernels_models.h"

namespace lathe::cuda {
namespace {

constexpr int kMaxPerLane = 8;  // E ≤ 256

__global__ void router_kernel(const float* __restrict__ scores, const float* __restrict__ expert_scale, int64_t E,
                              int64_t K, int32_t* __restrict__ idx, float* __restrict__ w) {
  const int64_t t = blockIdx.x;
  const int lane = threadIdx.x;
  const float* s = scores + t * E;
  float p[kMaxPerLane];
  float mx = -FLT_MAX;
#pragma unroll
  for (int r = 0; r < kMaxPerLane; ++r) {
    const int64_t e = lane + 32 * r;
    p[r] = e < E ? s[e] : -FLT_MAX;
    mx = fmaxf(mx, p[r]);
  }
  mx = warp_max(mx);
  float sum = 0.f;
#pragma unroll
  for (int r = 0; r < kMaxPerLane; ++r) {
    const int64_t e = lane + 32 * r;
    p[r] = e < E ? expf(p[r] - mx) : 0.f;
    sum += p[r];
  }
  sum = warp_sum(sum);
  bool taken[kMaxPerLane] = {};
  float top_sum = 0.f;
  float my_prob = 0.f;  // lane k keeps pick k's probability
  int32_t my_idx = 0;
  for (int64_t k = 0; k < K; ++k) {
    // Highest probability not yet taken; ties go to the lower expert index.
    float best = -1.f;
    int32_t bi = static_cast<int32_t>(E);
#pragma unroll
    for (int r = 0; r < kMaxPerLane; ++r) {
      const int32_t e = lane + 32 * r;
      const float pr = p[r] / sum;
      if (e < E && !taken[r] && (pr > best || (pr == best && e < bi))) {
        best = pr;
        bi = e;
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ob > best || (ob == best && oi < bi)) {
        best = ob;
        bi = oi;
      }
    }
    if (bi % 32 == lane) taken[bi / 32] = true;
    top_sum += best;
    if (lane == k) {
      my_prob = best;
      my_idx = bi;
    }
  }
  if (lane < K) {
    idx[t * K + lane] = my_idx;
    w[t * K + lane] = my_prob / top_sum * expert_scale[my_idx];
  }
}

__global__ void gather_kernel(const uint32_t* __restrict__ x, const int32_t* __restrict__ idx, int64_t words,
                              int64_t total, uint32_t* __restrict__ out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < total) out[i] = x[static_cast<int64_t>(idx[i / words]) * words + i % words];
}

template <class T>
__global__ void scatter_add_kernel(float* out, int64_t D, const int32_t* __restrict__ idx, const T* __restrict__ x,
                                   const float* __restrict__ w, int64_t total) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= total) return;
  const int64_t r = i / D;
  // Atomic so repeated indices add up; with distinct indices (one expert's tokens) the result is deterministic.
  atomicAdd(out + static_cast<int64_t>(idx[r]) * D + i % D, w[r] * to_f(x[i]));
}

}  // namespace

void router_topk(const float* scores, const float* expert_scale, int64_t T_, int64_t E, int64_t k, int32_t* idx,
                 float* w) {
  if (E > 32 * kMaxPerLane || k > 32 || k > E)
    throw Error(ErrorKind::Unsupported, "router_topk: more than 256 experts or 32 picks on CUDA");
  if (T_ == 0) return;
  router_kernel<<<static_cast<unsigned>(T_), 32, 0, stream()>>>(scores, expert_scale, E, k, idx, w);
  check_launch("router_topk");
}

void gather_rows(const void* x, const int32_t* idx, int64_t n, size_t row_bytes, void* out) {
  const int64_t words = static_cast<int64_t>(row_bytes / 4), total = n * words;
  if (total == 0) return;
  gather_kernel<<<blocks_for(total, 256), 256, 0, stream()>>>(static_cast<const uint32_t*>(x), idx, words, total,
                                                              static_cast<uint32_t*>(out));
  check_launch("gather_rows");
}

void scatter_add_rows(float* out, int64_t D, const int32_t* idx, const void* x, DType xt, const float* w, int64_t n) {
  const int64_t total = n * D;
  if (total == 0) return;
  LATHE_DISPATCH_ACT(xt, "scatter_add_rows", T,
                     scatter_add_kernel<T>
                     <<<blocks_for(total, 256), 256, 0, stream()>>>(out, D, idx, static_cast<const T*>(x), w, total));
  check_launch("scatter_add_rows");
}

}  // namespace lathe::cuda
