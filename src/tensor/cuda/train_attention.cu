// Causal GQA attention of one training sequence, forward and backward, in f32. Each block owns one query (or, in
// the key pass of backward, one key) of one head; its 4 warps take every 4th key (query) and each warp keeps an
// online softmax (or gradient sums) for the head dim in registers, one lane per 32nd feature (head dims up to 256);
// the warps' partials are merged through shared memory at the end. Forward keeps each row's log-sum-exp only;
// backward recomputes the probabilities from it (as flash attention does), with delta = rowsum(dO ⊙ O).
// Straightforward rather than fast: O(T²) dot products as warp reductions.
#include <cmath>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/train_kernels.h"

namespace lathe::cuda::train {
namespace {

constexpr int kAttnWarps = 4;
constexpr int kAttnPer = 8;  // features per lane: head dims up to 256

__device__ __forceinline__ int64_t ta_first_key(const AttnArgs& a, int64_t i) {
  int64_t f = a.window > 0 ? (i - a.window + 1 > 0 ? i - a.window + 1 : 0) : 0;
  if (a.seg && a.seg[i] > f) f = a.seg[i];
  return f;
}

// Σ_x regs[x] · glob[x] over the head dim, regs in registers (lane-strided), glob in memory; every lane gets it.
__device__ __forceinline__ float ta_rdot(const float* regs, const float* glob, int64_t D, int lane) {
  float d = 0.f;
#pragma unroll
  for (int e = 0; e < kAttnPer; ++e) {
    const int64_t x = lane + 32 * e;
    if (x < D) d += regs[e] * glob[x];
  }
  return warp_sum(d);
}

// A score (one row in registers, the other in memory) after scale and softcap; th gets tanh for the chain rule.
__device__ __forceinline__ float ta_score(const AttnArgs& a, const float* regs, const float* glob, int lane,
                                          float* th) {
  const float d = ta_rdot(regs, glob, a.D, lane) * a.scale;
  if (a.softcap > 0.f) {
    const float t = tanhf(d / a.softcap);
    *th = t;
    return t * a.softcap;
  }
  *th = 0.f;
  return d;
}

__device__ __forceinline__ float ta_dot(const float* r, const float* s, int64_t D, int lane) {  // both in memory
  float d = 0.f;
  for (int64_t x = lane; x < D; x += 32) d += r[x] * s[x];
  return warp_sum(d);
}

__device__ __forceinline__ void ta_load(float* dst, const float* src, int64_t D, int lane) {
#pragma unroll
  for (int e = 0; e < kAttnPer; ++e) {
    const int64_t x = lane + 32 * e;
    dst[e] = x < D ? src[x] : 0.f;
  }
}

// grid (T, Hq): query i of head h.
__global__ void ta_forward(AttnArgs a, float* out, float* lse) {
  const int64_t i = blockIdx.x, h = blockIdx.y, g = h / (a.Hq / a.Hkv);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float qv[kAttnPer], acc[kAttnPer];
  ta_load(qv, a.q + i * a.qc + h * a.D, a.D, lane);
#pragma unroll
  for (int e = 0; e < kAttnPer; ++e) acc[e] = 0.f;
  float m = -INFINITY, l = 0.f, th;
  for (int64_t j = ta_first_key(a, i) + warp; j <= i; j += kAttnWarps) {
    const float s = ta_score(a, qv, a.k + j * a.kc + g * a.D, lane, &th);
    const float mn = fmaxf(m, s), corr = expf(m - mn), p = expf(s - mn);
    l = l * corr + p;
    const float* vr = a.v + j * a.kc + g * a.D;
#pragma unroll
    for (int e = 0; e < kAttnPer; ++e) {
      const int64_t x = lane + 32 * e;
      acc[e] = acc[e] * corr + (x < a.D ? p * vr[x] : 0.f);
    }
    m = mn;
  }
  __shared__ float sm[kAttnWarps], sl[kAttnWarps], sacc[kAttnWarps][32 * kAttnPer];
  if (lane == 0) sm[warp] = m, sl[warp] = l;
#pragma unroll
  for (int e = 0; e < kAttnPer; ++e) sacc[warp][lane + 32 * e] = acc[e];
  __syncthreads();
  float M = -INFINITY;
  for (int w = 0; w < kAttnWarps; ++w) M = fmaxf(M, sm[w]);
  float L = 0.f;
  for (int w = 0; w < kAttnWarps; ++w) L += sm[w] == -INFINITY ? 0.f : sl[w] * expf(sm[w] - M);
  for (int64_t x = threadIdx.x; x < a.D; x += blockDim.x) {
    float o = 0.f;
    for (int w = 0; w < kAttnWarps; ++w)
      if (sm[w] != -INFINITY) o += sacc[w][x] * expf(sm[w] - M);
    out[i * a.qc + h * a.D + x] = o / L;
  }
  if (threadIdx.x == 0) lse[h * a.T + i] = M + logf(L);
}

// delta[h, i] = dO[i, h] · O[i, h]: Σ_j p_ij dp_ij, the softmax backward's row term. One warp per (i, h).
__global__ void ta_delta(AttnArgs a, const float* out, const float* gout, float* delta) {
  const int64_t w = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) >> 5;
  if (w >= a.T * a.Hq) return;
  const int64_t i = w / a.Hq, h = w % a.Hq;
  const int64_t off = i * a.qc + h * a.D;
  const float d = ta_dot(out + off, gout + off, a.D, threadIdx.x & 31);
  if ((threadIdx.x & 31) == 0) delta[h * a.T + i] = d;
}

// d score_ij (pre-scale, through the softcap) from p and dp.
__device__ __forceinline__ float ta_dscore(const AttnArgs& a, float p, float dp, float delta, float th) {
  float ds = p * (dp - delta);
  if (a.softcap > 0.f) ds *= 1.0f - th * th;
  return ds * a.scale;
}

// Sums each warp's per-lane vector and adds the block total into dst[0, D).
__device__ void ta_merge_add(float (*part)[32 * kAttnPer], const float* acc, int64_t D, float* dst) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int e = 0; e < kAttnPer; ++e) part[warp][lane + 32 * e] = acc[e];
  __syncthreads();
  for (int64_t x = threadIdx.x; x < D; x += blockDim.x) {
    float s = 0.f;
    for (int w = 0; w < kAttnWarps; ++w) s += part[w][x];
    dst[x] += s;
  }
  __syncthreads();
}

// grid (T, Hq): dq of query i, head h.
__global__ void ta_backward_q(AttnArgs a, const float* lse, const float* gout, const float* delta, float* gq) {
  const int64_t i = blockIdx.x, h = blockIdx.y, g = h / (a.Hq / a.Hkv);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float qv[kAttnPer], gov[kAttnPer], acc[kAttnPer];
  ta_load(qv, a.q + i * a.qc + h * a.D, a.D, lane);
  ta_load(gov, gout + i * a.qc + h * a.D, a.D, lane);
#pragma unroll
  for (int e = 0; e < kAttnPer; ++e) acc[e] = 0.f;
  const float l = lse[h * a.T + i], dl = delta[h * a.T + i];
  float th;
  for (int64_t j = ta_first_key(a, i) + warp; j <= i; j += kAttnWarps) {
    const float* kr = a.k + j * a.kc + g * a.D;
    const float p = expf(ta_score(a, qv, kr, lane, &th) - l);
    const float dp = ta_rdot(gov, a.v + j * a.kc + g * a.D, a.D, lane);
    const float ds = ta_dscore(a, p, dp, dl, th);
#pragma unroll
    for (int e = 0; e < kAttnPer; ++e) {
      const int64_t x = lane + 32 * e;
      if (x < a.D) acc[e] += ds * kr[x];
    }
  }
  __shared__ float part[kAttnWarps][32 * kAttnPer];
  ta_merge_add(part, acc, a.D, gq + i * a.qc + h * a.D);
}

// grid (T, Hkv): dk and dv of key j, kv head g, over every query head of the group and every query that sees j.
__global__ void ta_backward_kv(AttnArgs a, const float* lse, const float* gout, const float* delta, float* gk,
                               float* gv) {
  const int64_t j = blockIdx.x, g = blockIdx.y, rep = a.Hq / a.Hkv;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float kv[kAttnPer], vv[kAttnPer], acck[kAttnPer], accv[kAttnPer];
  ta_load(kv, a.k + j * a.kc + g * a.D, a.D, lane);
  ta_load(vv, a.v + j * a.kc + g * a.D, a.D, lane);
#pragma unroll
  for (int e = 0; e < kAttnPer; ++e) acck[e] = accv[e] = 0.f;
  int64_t end = a.T;  // queries past j + window cannot see j
  if (a.window > 0 && j + a.window < end) end = j + a.window;
  const int64_t span = end - j;
  float th;
  for (int64_t idx = warp; idx < rep * span; idx += kAttnWarps) {
    const int64_t h = g * rep + idx / span, i = j + idx % span;
    if (ta_first_key(a, i) > j) continue;  // uniform per warp
    const float* qr = a.q + i * a.qc + h * a.D;
    const float* gor = gout + i * a.qc + h * a.D;
    const float p = expf(ta_score(a, kv, qr, lane, &th) - lse[h * a.T + i]);
    const float ds = ta_dscore(a, p, ta_rdot(vv, gor, a.D, lane), delta[h * a.T + i], th);
#pragma unroll
    for (int e = 0; e < kAttnPer; ++e) {
      const int64_t x = lane + 32 * e;
      if (x < a.D) {
        accv[e] += p * gor[x];
        acck[e] += ds * qr[x];
      }
    }
  }
  __shared__ float part[kAttnWarps][32 * kAttnPer];
  ta_merge_add(part, acck, a.D, gk + j * a.kc + g * a.D);
  ta_merge_add(part, accv, a.D, gv + j * a.kc + g * a.D);
}

}  // namespace

void attention(const AttnArgs& a, float* out, float* lse) {
  if (a.D > 32 * kAttnPer) throw Error(ErrorKind::Unsupported, "CUDA training attention: head dim above 256");
  if (a.T == 0) return;
  ta_forward<<<dim3(static_cast<unsigned>(a.T), static_cast<unsigned>(a.Hq)), 32 * kAttnWarps, 0, stream()>>>(a, out,
                                                                                                              lse);
  check_launch("train attention");
}

void attention_backward(const AttnArgs& a, const float* out, const float* lse, const float* gout, float* delta,
                        float* gq, float* gk, float* gv) {
  if (a.D > 32 * kAttnPer) throw Error(ErrorKind::Unsupported, "CUDA training attention: head dim above 256");
  if (a.T == 0) return;
  const int64_t warps = a.T * a.Hq;
  ta_delta<<<static_cast<unsigned>((warps * 32 + 255) / 256), 256, 0, stream()>>>(a, out, gout, delta);
  check_launch("train attention delta");
  ta_backward_q<<<dim3(static_cast<unsigned>(a.T), static_cast<unsigned>(a.Hq)), 32 * kAttnWarps, 0, stream()>>>(
      a, lse, gout, delta, gq);
  check_launch("train attention backward q");
  ta_backward_kv<<<dim3(static_cast<unsigned>(a.T), static_cast<unsigned>(a.Hkv)), 32 * kAttnWarps, 0, stream()>>>(
      a, lse, gout, delta, gk, gv);
  check_launch("train attention backward kv");
}

}  // namespace lathe::cuda::train
