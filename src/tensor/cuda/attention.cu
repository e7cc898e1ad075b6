// Softmax attention on CUDA cores, for any head size: the f32 / fallback path for decode and prefill, and its
// split merge (decode_attention.cu serves bf16 decode steps, flash.cu bf16 prefill).
// Grid (query t, kv head, split); one warp per query head of the kv head's GQA group, so the group shares
// K/V rows through L1. A warp scores 32 keys at once (one key per lane, full dot product), updates an online
// softmax, then accumulates p·V with lanes owning output dims. With several splits, each writes (max, sum,
// acc) and a second kernel merges them.
#include <algorithm>
#include <cfloat>
#include <cmath>

#include "common/env.h"
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/decode_attention.h"
#include "tensor/cuda/kernels.h"
#include "tensor/device_memory.h"

namespace lathe::cuda {
namespace {

constexpr int kMaxDvPerLane = 8;  // Dv ≤ 256

template <class T>
__global__ void attn_kernel(const AttentionArgs a, float* __restrict__ part) {
  extern __shared__ float qs[];  // [group][D]
  const int64_t t = blockIdx.x, kh = blockIdx.y, split = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t group = a.Hq / a.Hkv;
  const int64_t h = kh * group + warp;
  const T* q = static_cast<const T*>(a.q) + t * a.q_s0 + h * a.q_s1;
  float* qw = qs + warp * a.D;
  for (int64_t d = lane; d < a.D; d += 32) qw[d] = to_f(q[d]);
  __syncwarp();

  // A replayed decode step sits `delta` tokens after the one captured: more keys, later query.
  const int64_t dl = a.delta ? *a.delta : 0;
  const int64_t S = a.S + dl, qpos = a.q_pos0 + dl + t;
  const int64_t chunk = (S + gridDim.z - 1) / gridDim.z;
  int64_t j0 = split * chunk, j1 = min(S, j0 + chunk);
  if (!a.k_pos) {
    if (a.causal) j1 = min(j1, max(qpos - a.k_pos0 + 1, int64_t{0}));
    if (a.window > 0) j0 = max(j0, qpos - a.window + 1 - a.k_pos0);
  }
  const T* kb = static_cast<const T*>(a.k) + kh * a.k_s1;
  const bool vec = sizeof(T) == 2 && a.D % 8 == 0 && a.k_s0 % 8 == 0 && a.k_s1 % 8 == 0;
  const T* vb = static_cast<const T*>(a.v) + kh * a.v_s1;
  float m = -INFINITY, l = 0.f;
  float acc[kMaxDvPerLane];
#pragma unroll
  for (int i = 0; i < kMaxDvPerLane; ++i) acc[i] = 0.f;

  for (int64_t jb = j0; jb < j1; jb += 32) {
    const int64_t j = jb + lane;
    float s = -INFINITY;
    if (j < j1) {
      bool vis = true;
      if (a.k_pos) {
        const int64_t kp = a.k_pos[j];
        vis = !(a.causal && kp > qpos) && !(a.window > 0 && qpos - kp >= a.window);
      }
      if (vis) {
        const T* kr = kb + j * a.k_s0;
        float dot = 0.f;
        if (vec) {  // 16-byte loads of 8 bf16 keys' features
          for (int64_t d = 0; d < a.D; d += 8) {
            const uint4 kv = *reinterpret_cast<const uint4*>(kr + d);
            const uint32_t w[4] = {kv.x, kv.y, kv.z, kv.w};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              dot = fmaf(qw[d + 2 * e], __uint_as_float(w[e] << 16), dot);
              dot = fmaf(qw[d + 2 * e + 1], __uint_as_float(w[e] & 0xffff0000u), dot);
            }
          }
        } else {
          for (int64_t d = 0; d < a.D; ++d) dot = fmaf(qw[d], to_f(kr[d]), dot);
        }
        s = dot * a.scale;
        if (a.softcap > 0.f) s = tanhf(s / a.softcap) * a.softcap;
      }
    }
    const float mb = warp_max(s);
    if (mb == -INFINITY) continue;
    const float mn = fmaxf(m, mb);
    const float corr = m == -INFINITY ? 0.f : expf(m - mn);
    const float p = s == -INFINITY ? 0.f : expf(s - mn);
    l = l * corr + warp_sum(p);
#pragma unroll
    for (int i = 0; i < kMaxDvPerLane; ++i) acc[i] *= corr;
    const int64_t n = min(int64_t{32}, j1 - jb);
    for (int64_t jj = 0; jj < n; ++jj) {
      const float pj = __shfl_sync(0xffffffffu, p, static_cast<int>(jj));
      if (pj == 0.f) continue;
      const T* vr = vb + (jb + jj) * a.v_s0;
#pragma unroll
      for (int i = 0; i < kMaxDvPerLane; ++i) {
        const int64_t d = lane + 32 * i;
        if (d < a.Dv) acc[i] = fmaf(pj, to_f(vr[d]), acc[i]);
      }
    }
    m = mn;
  }

  if (gridDim.z == 1) {
    T* o = static_cast<T*>(a.out) + (t * a.Hq + h) * a.Dv;
    const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
    for (int i = 0; i < kMaxDvPerLane; ++i) {
      const int64_t d = lane + 32 * i;
      if (d < a.Dv) o[d] = from_f<T>(acc[i] * inv);
    }
    return;
  }
  // Partial: [t][h][split] × (m, l, acc[Dv]).
  float* pp = part + ((t * a.Hq + h) * gridDim.z + split) * (a.Dv + 2);
  if (lane == 0) {
    pp[0] = m;
    pp[1] = l;
  }
#pragma unroll
  for (int i = 0; i < kMaxDvPerLane; ++i) {
    const int64_t d = lane + 32 * i;
    if (d < a.Dv) pp[2 + d] = acc[i];
  }
}

// One block per (t, head): the split weights exp(m_s − M) are computed once into shared memory (a warp over
// the splits), then each thread sums its output dims over the splits with independent loads.
template <class T>
__global__ void combine_kernel(const float* __restrict__ part, int splits, int64_t Dv, T* __restrict__ out) {
  constexpr int kMaxSplits = 1024;
  __shared__ float wgt[kMaxSplits];
  __shared__ float inv_l;
  const int64_t th = blockIdx.x;  // t * Hq + h
  const float* pp = part + th * splits * (Dv + 2);
  if (threadIdx.x < 32) {
    float M = -INFINITY;
    for (int s = threadIdx.x; s < splits; s += 32) M = fmaxf(M, pp[s * (Dv + 2)]);
    M = warp_max(M);
    float L = 0.f;
    for (int s = threadIdx.x; s < splits; s += 32) {
      const float m = pp[s * (Dv + 2)];
      const float w = m == -INFINITY ? 0.f : expf(m - M);
      wgt[s] = w;
      L += w * pp[s * (Dv + 2) + 1];
    }
    L = warp_sum(L);
    if (threadIdx.x == 0) inv_l = L > 0.f ? 1.f / L : 0.f;
  }
  __syncthreads();
  for (int64_t d = threadIdx.x; d < Dv; d += blockDim.x) {
    float acc = 0.f;
#pragma unroll 8
    for (int s = 0; s < splits; ++s) acc = fmaf(wgt[s], pp[s * (Dv + 2) + 2 + d], acc);
    out[th * Dv + d] = from_f<T>(acc * inv_l);
  }
}

}  // namespace

bool decode_attention_off() {  // LATHE_CUDA_DECODE_ATTN=0: the per-head kernel below, for comparisons
  static const bool off = !env_switch("LATHE_CUDA_DECODE_ATTN");
  return off;
}

bool kv_in_place_on() {
  static const bool on = env_switch("LATHE_CUDA_KV_IN_PLACE");
  return on;
}

void attention(const AttentionArgs& a) {
  if (a.T == 0) return;
  const int64_t group = a.Hq / a.Hkv;
  if (group * 32 > 1024 || a.Dv > 32 * kMaxDvPerLane)
    throw Error(ErrorKind::Unsupported, "CUDA attention: more than 32 query heads per kv head or head size > 256");
  // Quantized K/V are read in place by the decode kernel alone (the others read bf16 or f32 rows).
  if (a.kv_bits && (!decode_attention_applies(a) || decode_attention_off()))
    throw Error(ErrorKind::Unsupported, "CUDA attention: quantized K/V outside the decode kernel");
  if (!a.kv_bits && attention_flash(a)) return;
  if (decode_attention_applies(a) && !decode_attention_off()) {
    const int splits = decode_attention_splits(a);
    const size_t part_bytes = static_cast<size_t>(a.Hq * splits * (a.Dv + 4)) * sizeof(float);
    float* part = splits > 1 ? static_cast<float*>(device_alloc(part_bytes)) : nullptr;
    decode_attention(a, splits, part);
    if (part) device_free(part);
    return;
  }
  // Enough blocks to fill the chip; each split covers at least 64 keys.
  int64_t splits = 1;
  const int64_t blocks = a.T * a.Hkv;
  if (blocks < 2 * sm_count() && a.S > 128) {
    splits = std::min<int64_t>((2 * sm_count() + blocks - 1) / blocks, (a.S + 63) / 64);
    splits = std::max<int64_t>(splits, 1);
  }
  const dim3 grid(static_cast<unsigned>(a.T), static_cast<unsigned>(a.Hkv), static_cast<unsigned>(splits));
  const size_t smem = static_cast<size_t>(group * a.D) * sizeof(float);
  float* part = nullptr;
  const size_t part_bytes = splits > 1 ? static_cast<size_t>(a.T * a.Hq * splits * (a.Dv + 2)) * sizeof(float) : 0;
  if (part_bytes) part = static_cast<float*>(device_alloc(part_bytes));
  LATHE_DISPATCH_ACT(a.t, "attention", T, {
    attn_kernel<T><<<grid, static_cast<unsigned>(group * 32), smem, stream()>>>(a, part);
    check_launch("attention");
    if (splits > 1) {
      combine_kernel<T><<<static_cast<unsigned>(a.T * a.Hq), 128, 0, stream()>>>(part, static_cast<int>(splits), a.Dv,
                                                                                 static_cast<T*>(a.out));
      check_launch("attention_combine");
    }
  });
  if (part) device_free(part);
}

}  // namespace lathe::cuda
