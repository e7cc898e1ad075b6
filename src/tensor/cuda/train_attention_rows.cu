// Row kernels of the GEMM attention path (train_attention_gemm.cc): one block per (head, query) row of [T] raw
// scores (scale applied). Masked keys (after the query, before its window or its packed segment) become 0 in P
// and dS. Formulas as the direct kernels and ag::attention: softcap tanh(s / cap) · cap, then softmax.
#include <cmath>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/train_kernels.h"
#include "tensor/cuda/train_reduce.cuh"

namespace lathe::cuda::train {
namespace {

constexpr int kRowThreads = 256;

__device__ __forceinline__ int64_t tr_first_key(const AttnArgs& a, int64_t i) {
  int64_t f = a.window > 0 ? (i - a.window + 1 > 0 ? i - a.window + 1 : 0) : 0;
  if (a.seg && a.seg[i] > f) f = a.seg[i];
  return f;
}

__device__ __forceinline__ float tr_capped(const AttnArgs& a, float raw, float* th) {
  if (a.softcap > 0.f) {
    const float t = tanhf(raw / a.softcap);
    *th = t;
    return t * a.softcap;
  }
  *th = 0.f;
  return raw;
}

__global__ void tr_softmax(AttnArgs a, int64_t h0, float* s, float* lse) {
  const int64_t row = blockIdx.x, h = h0 + row / a.T, i = row % a.T, j0 = tr_first_key(a, i);
  float* sr = s + row * a.T;
  float th, m = -INFINITY;
  for (int64_t j = j0 + threadIdx.x; j <= i; j += blockDim.x) m = fmaxf(m, tr_capped(a, sr[j], &th));
  m = train_block_max(m);
  float sum = 0.f;
  for (int64_t j = j0 + threadIdx.x; j <= i; j += blockDim.x) sum += expf(tr_capped(a, sr[j], &th) - m);
  const float l = m + logf(train_block_sum(sum));
  for (int64_t j = threadIdx.x; j < a.T; j += blockDim.x)
    sr[j] = j >= j0 && j <= i ? expf(tr_capped(a, sr[j], &th) - l) : 0.f;
  if (threadIdx.x == 0) lse[h * a.T + i] = l;
}

__global__ void tr_softmax_backward(AttnArgs a, int64_t h0, const float* lse, float* s, float* dp) {
  const int64_t row = blockIdx.x, h = h0 + row / a.T, i = row % a.T, j0 = tr_first_key(a, i);
  float* sr = s + row * a.T;
  float* dr = dp + row * a.T;
  const float l = lse[h * a.T + i];
  float th, dot = 0.f;  // Σ_j p_j dp_j
  for (int64_t j = j0 + threadIdx.x; j <= i; j += blockDim.x) dot += expf(tr_capped(a, sr[j], &th) - l) * dr[j];
  dot = train_block_sum(dot);
  for (int64_t j = threadIdx.x; j < a.T; j += blockDim.x) {
    if (j < j0 || j > i) {
      sr[j] = dr[j] = 0.f;
      continue;
    }
    const float p = expf(tr_capped(a, sr[j], &th) - l);
    float ds = p * (dr[j] - dot);
    if (a.softcap > 0.f) ds *= 1.0f - th * th;
    sr[j] = p;
    dr[j] = ds * a.scale;
  }
}

}  // namespace

void attention_softmax_rows(const AttnArgs& a, int64_t h0, int64_t rows, float* s, float* lse) {
  if (rows <= 0) return;
  tr_softmax<<<static_cast<unsigned>(rows), kRowThreads, 0, stream()>>>(a, h0, s, lse);
  check_launch("train attention softmax rows");
}

void attention_softmax_backward_rows(const AttnArgs& a, int64_t h0, int64_t rows, const float* lse, float* s,
                                     float* dp) {
  if (rows <= 0) return;
  tr_softmax_backward<<<static_cast<unsigned>(rows), kRowThreads, 0, stream()>>>(a, h0, lse, s, dp);
  check_launch("train attention softmax backward rows");
}

}  // namespace lathe::cuda::train
