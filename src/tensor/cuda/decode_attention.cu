// Single-query (decode) attention for bf16 K/V: one block per (kv head, split) serves every query head of the
// GQA group, so each K and V row is read once per step rather than once per query head. The old per-head
// kernel (attention.cu) scored one key per lane with a serial 128-feature dot product and walked V one key at
// a time: latency-bound at every context. Here, per sub-chunk of up to kSub keys:
//   1. scores: D/8 lanes share a key (16-byte loads, shuffle reduction), all heads of the group at once;
//   2. softmax: one warp per head updates the running max/sum and turns scores into probabilities in place;
//   3. p·V: each thread owns 8 output dims of every head and a stride of keys (16-byte V loads).
// Splits are fixed by the kv-head count, not by the context, so a decode step captured in a graph at a short
// context still spreads a long one over the chip. Each split covers at least kMinChunk keys (blocks past the
// keys exit at once); with one active split the block writes the output, otherwise the last active split of
// each kv head to finish merges the partials (no separate combine launch).
// A batched step (decode_attention_rows) runs the same kernel over grid z = row, each row's q, K/V, context
// length and positions read from a small device array: one launch per layer for all rows, and each row's
// arithmetic (splits, chunking, reduction order) exactly what its solo launch does. Built to spread one row
// over the chip, it is slow for many rows (64 rows: 225 µs a layer on the H200); wider steps, which are not
// bitwise their solo runs anyway, take decode_attention_wide.cu instead.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <type_traits>

#include "common/env.h"
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/decode_attention.h"
#include "tensor/cuda/kv_dequant.cuh"

namespace lathe::cuda {
namespace {

constexpr int kThreads = 128, kWarps = kThreads / 32;
constexpr int kSub = 256;     // keys scored per pass (shared-memory scores)
constexpr int kMaxGroup = 8;  // query heads per kv head
// Keys per split at least: short contexts use few splits, cheap to merge. Each block of a short context is
// latency-bound (one block per SM, a long dependent chain), so its key count sets the kernel's time: 16 keys
// decode Qwen3-4B at context 128 at 453 tok/s against 441 with 32 (8: 452; H200).
constexpr int kMinChunk = 16;
constexpr int kMaxCounters = 1 << 16;
// Keys a pass holds at most to take the lean (less unrolled) loops, see score_keys: 64, or
// LATHE_CUDA_DECODE_LEAN_KEYS (0: never), read once.
int lean_keys() {
  static const int v = static_cast<int>(std::clamp<int64_t>(env_int("LATHE_CUDA_DECODE_LEAN_KEYS", 64), 0, 1 << 30));
  return v;
}  // split counters: kv heads × rows of one launch

// Keys per split at a context of S keys, and the splits that hold keys (the rest exit at once): the kernel's
// chunking, which the batched launch also reads on the host to size its grid.
__host__ __device__ __forceinline__ int split_chunk(int S, int splits) {
  const int c = (S + splits - 1) / splits;
  return c > kMinChunk ? c : kMinChunk;
}
__host__ __device__ __forceinline__ int active_splits(int S, int chunk) { return (S + chunk - 1) / chunk; }

// Where a thread reads its 8 consecutive features of every K (or V) row of its kv head: bf16 values (kBits 0),
// or MLX codes (kBits 4 or 8) with the bf16 scale and bias of the group holding those features. A row's 8
// features never straddle a group (groups are multiples of 8).
template <int kBits>
struct KvSrc {
  const char* base = nullptr;                      // feature f0 of row 0
  const __nv_bfloat16 *s = nullptr, *b = nullptr;  // its group's scale and bias in row 0
  int64_t row = 0, sb_row = 0;                     // row strides: values, groups
};
// Raw loads of one row's 8 features, issued before any of their math (several rows in flight per thread).
template <int kBits>
struct KvRaw {
  uint4 w;
};
template <>
struct KvRaw<8> {
  uint2 w;
  __nv_bfloat16 s, b;
};
template <>
struct KvRaw<4> {
  uint32_t w;
  __nv_bfloat16 s, b;
};

// head: the kv head's first value in row 0 (head_sb: its first group); f: the thread's first feature.
template <int kBits>
__device__ __forceinline__ KvSrc<kBits> kv_src(const void* data, const void* scales, const void* biases, int64_t head,
                                               int f, int64_t row, int64_t gs, int64_t head_sb, int64_t sb_row) {
  KvSrc<kBits> src;
  src.base = static_cast<const char*>(data) + (head + f) * (kBits ? kBits : 16) / 8;
  src.row = row;
  if constexpr (kBits != 0) {
    src.s = static_cast<const __nv_bfloat16*>(scales) + head_sb + f / gs;
    src.b = static_cast<const __nv_bfloat16*>(biases) + head_sb + f / gs;
    src.sb_row = sb_row;
  }
  return src;
}

template <int kBits>
__device__ __forceinline__ KvRaw<kBits> kv_load(const KvSrc<kBits>& src, int64_t j) {
  KvRaw<kBits> r;
  if constexpr (kBits == 0) {
    r.w = *reinterpret_cast<const uint4*>(src.base + j * src.row * 2);
  } else {
    if constexpr (kBits == 8)
      r.w = *reinterpret_cast<const uint2*>(src.base + j * src.row);
    else
      r.w = *reinterpret_cast<const uint32_t*>(src.base + j * src.row / 2);
    r.s = src.s[j * src.sb_row];
    r.b = src.b[j * src.sb_row];
  }
  return r;
}

template <int kBits>
__device__ __forceinline__ KvRaw<kBits> kv_zero() {
  KvRaw<kBits> r;
  if constexpr (kBits == 0) {
    r.w = make_uint4(0, 0, 0, 0);
  } else {
    r.w = {};
    r.s = r.b = __float2bfloat16_rn(0.f);
  }
  return r;
}

// The 8 features as floats. Codes go through dequantize_any's arithmetic (fmaf(scale, code, bias), rounded to
// the activations' bf16), which is what keeps the result bitwise that of attending over a dequantized copy.
template <int kBits>
__device__ __forceinline__ void kv_floats(const KvRaw<kBits>& r, float f[8]) {
  if constexpr (kBits == 0) {
    bf16x8(r.w, f);
  } else {
    const float sc = __bfloat162float(r.s), bi = __bfloat162float(r.b);
    if constexpr (kBits == 8)
      dequant8<8>(r.w, sc, bi, f);
    else
      dequant8<4>(make_uint2(r.w, 0u), sc, bi, f);
  }
}

// kG: the largest group this instantiation serves (2, 4 or 8): the per-head register arrays are sized by it,
// and smaller groups leave registers for more keys in flight per thread (the score loop's batch, the p·V unroll).
// kBits: 0 for bf16 K/V, else the codes' width.
template <int kG, int kBits>
__global__ void __launch_bounds__(kThreads)
    attn_decode_kernel(const AttentionArgs a, const DecodeRow* __restrict__ rows, int splits, float* __restrict__ part,
                       int* __restrict__ counters, int lean) {
  pdl_trigger();  // o_proj's GEMV follows
  extern __shared__ float smem[];
  float* sc = smem;                      // [kMaxGroup][kSub] scores, then probabilities
  float* red = smem + kMaxGroup * kSub;  // [KS][G][Dv] partial sums of the key strides
  __shared__ float m_s[kMaxGroup], l_s[kMaxGroup], corr_s[kMaxGroup];
  const int kh = blockIdx.x, split = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int G = static_cast<int>(a.Hq / a.Hkv), D = static_cast<int>(a.D), Dv = static_cast<int>(a.Dv);
  const int L = D / 8, kpw = 32 / L;  // lanes per key, keys per warp per step (scores)
  const int P8 = Dv / 8, KS = kThreads / P8;
  const int c = tid % P8, ks = tid / P8;  // p·V: output dims [8c, 8c + 8), keys ks, ks + KS, ...

  // Key indices and counts in 32 bits (contexts stay far below 2^31): 64-bit divisions here cost ~100
  // instructions each, paid by every block, the many that exit at a short context included.
  const int64_t dl = a.delta ? *a.delta : 0;
  const void *q_ptr = a.q, *k_ptr = a.k, *v_ptr = a.v;
  void* out_ptr = a.out;
  const void *ks_ptr = a.k_scales, *kb_ptr = a.k_biases, *vs_ptr = a.v_scales, *vb_ptr = a.v_biases;
  const int64_t* k_pos = a.k_pos;
  int64_t S_row = a.S, q_pos0 = a.q_pos0, k_pos0 = a.k_pos0;
  if (rows) {  // batched: this row's tensors and positions; outputs and merge state at the row's offset
    const DecodeRow& d = rows[blockIdx.z];
    q_ptr = d.q;
    k_ptr = d.k;
    v_ptr = d.v;
    ks_ptr = d.k_scales;
    kb_ptr = d.k_biases;
    vs_ptr = d.v_scales;
    vb_ptr = d.v_biases;
    k_pos = d.k_pos;
    S_row = d.S;
    q_pos0 = d.q_pos0;
    k_pos0 = d.k_pos0;
    out_ptr = static_cast<__nv_bfloat16*>(a.out) + blockIdx.z * a.Hq * a.Dv;
    if (part) part += blockIdx.z * a.Hq * splits * (a.Dv + 4);
    if (counters) counters += blockIdx.z * a.Hkv;
  }
  const int S = static_cast<int>(S_row + dl);
  const int64_t qpos = q_pos0 + dl;
  const int chunk = split_chunk(S, splits);
  const int active = active_splits(S, chunk);
  if (split >= active) return;
  int j0 = split * chunk, j1 = min(S, j0 + chunk);
  if (!k_pos) {
    const int64_t last = qpos - k_pos0 + 1, first = qpos - a.window + 1 - k_pos0;
    if (a.causal && last < j1) j1 = static_cast<int>(last > 0 ? last : 0);
    if (a.window > 0 && first > j0) j0 = static_cast<int>(first);
  }

  const auto* qb = static_cast<const __nv_bfloat16*>(q_ptr) + kh * G * a.q_s1 + (lane % L) * 8;
  float q[kG][8];
#pragma unroll
  for (int h = 0; h < kG; ++h) {
    if (h < G) {
      bf16x8(*reinterpret_cast<const uint4*>(qb + h * a.q_s1), q[h]);
#pragma unroll
      for (int e = 0; e < 8; ++e) q[h][e] *= a.scale;
    }
  }
  if (tid < kMaxGroup) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.f;
  }
  float acc[kG][8];
#pragma unroll
  for (int h = 0; h < kG; ++h)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[h][e] = 0.f;
  const KvSrc<kBits> kb =
      kv_src<kBits>(k_ptr, ks_ptr, kb_ptr, kh * a.k_s1, (lane % L) * 8, a.k_s0, a.k_gs, kh * a.ksb_s1, a.ksb_s0);
  const KvSrc<kBits> vb =
      kv_src<kBits>(v_ptr, vs_ptr, vb_ptr, kh * a.v_s1, c * 8, a.v_s0, a.v_gs, kh * a.vsb_s1, a.vsb_s0);

  for (int base = j0; base < j1; base += kSub) {
    const int n = min(kSub, j1 - base);
    __syncthreads();  // the previous pass is done with sc; m_s/l_s initialised
    // kB keys per lane in flight: their loads are issued before any of their math. A short pass (a split of a
    // short context) takes the lean loop: the wide one's unrolled code costs more to fetch than its loads save
    // (H100, Qwen3-4B heads: 16 keys a split 11.1 → 7.3 µs, 150 keys 14.5 → 10.6; 16k keys unchanged with
    // the wide one). Unrolling changes no sum's order, so both loops give the same bits.
    const auto score_keys = [&](auto batch) {
      constexpr int kB = decltype(batch)::value;
      for (int jb = warp * kpw; jb < n; jb += kB * kWarps * kpw) {
        KvRaw<kBits> kr[kB];
#pragma unroll
        for (int i = 0; i < kB; ++i) {
          const int jj = jb + i * kWarps * kpw + lane / L;
          kr[i] = jj < n ? kv_load(kb, base + jj) : kv_zero<kBits>();
        }
#pragma unroll
        for (int i = 0; i < kB; ++i) {
          const int jj = jb + i * kWarps * kpw + lane / L;
          float kf[8], dot[kG];
          kv_floats(kr[i], kf);
#pragma unroll
          for (int h = 0; h < kG; ++h) {
            dot[h] = 0.f;
            if (h < G) {
#pragma unroll
              for (int e = 0; e < 8; ++e) dot[h] = fmaf(q[h][e], kf[e], dot[h]);
            }
          }
          for (int o = L / 2; o > 0; o >>= 1) {
#pragma unroll
            for (int h = 0; h < kG; ++h)
              if (h < G) dot[h] += __shfl_xor_sync(0xffffffffu, dot[h], o);
          }
          if (jj < n && lane % L == 0) {
            bool vis = true;
            if (k_pos) {
              const int64_t kp = k_pos[base + jj];
              vis = !(a.causal && kp > qpos) && !(a.window > 0 && qpos - kp >= a.window);
            }
#pragma unroll
            for (int h = 0; h < kG; ++h) {
              if (h < G) {
                float s = dot[h];
                if (a.softcap > 0.f) s = tanhf(s / a.softcap) * a.softcap;
                sc[h * kSub + jj] = vis ? s : -INFINITY;
              }
            }
          }
        }
      }
    };
    if (n <= lean)
      score_keys(std::integral_constant<int, 2>{});
    else
      score_keys(std::integral_constant < int, kG <= 4 ? 8 : 4 > {});
    __syncthreads();
    for (int h = warp; h < G; h += kWarps) {
      float* row = sc + h * kSub;
      float mx = -INFINITY;
      for (int i = lane; i < n; i += 32) mx = fmaxf(mx, row[i]);
      mx = warp_max(mx);
      const float mo = m_s[h], mn = fmaxf(mo, mx);
      float sum = 0.f;
      for (int i = lane; i < n; i += 32) {
        const float p = mn == -INFINITY ? 0.f : expf(row[i] - mn);
        row[i] = p;
        sum += p;
      }
      sum = warp_sum(sum);
      __syncwarp();
      if (lane == 0) {
        const float corr = mo == -INFINITY ? 0.f : expf(mo - mn);
        l_s[h] = l_s[h] * corr + sum;
        m_s[h] = mn;
        corr_s[h] = corr;
      }
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < kG; ++h) {
      if (h < G) {
        const float corr = corr_s[h];
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[h][e] *= corr;
      }
    }
    const auto accumulate_values = [&](auto unroll) {
      constexpr int kU = decltype(unroll)::value;
#pragma unroll(kU)
      for (int jj = ks; jj < n; jj += KS) {
        float vf[8];
        kv_floats(kv_load(vb, base + jj), vf);
#pragma unroll
        for (int h = 0; h < kG; ++h) {
          if (h < G) {
            const float p = sc[h * kSub + jj];
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[h][e] = fmaf(p, vf[e], acc[h][e]);
          }
        }
      }
    };
    if (n <= lean)
      accumulate_values(std::integral_constant<int, 2>{});
    else
      accumulate_values(std::integral_constant < int, kG <= 4 ? 8 : 4 > {});
  }

  // Sum the key strides, then write the output (one split) or this split's partial (m, l, acc).
#pragma unroll
  for (int h = 0; h < kG; ++h)
    if (h < G)
#pragma unroll
      for (int e = 0; e < 8; ++e) red[(ks * G + h) * Dv + 8 * c + e] = acc[h][e];
  __syncthreads();
  for (int i = tid; i < G * Dv; i += kThreads) {
    const int h = i / Dv, d = i % Dv;
    float v = 0.f;
    for (int s = 0; s < KS; ++s) v += red[(s * G + h) * Dv + d];
    const int64_t hq = kh * G + h;
    if (active == 1) {
      const float l = l_s[h];
      static_cast<__nv_bfloat16*>(out_ptr)[hq * Dv + d] = __float2bfloat16_rn(l > 0.f ? v / l : 0.f);
    } else {
      float* pp = part + (hq * splits + split) * (Dv + 4);  // acc[Dv], m, l, 2 pad: rows stay 16-byte aligned
      pp[d] = v;
      if (d == 0) {
        pp[Dv] = m_s[h];
        pp[Dv + 1] = l_s[h];
      }
    }
  }
  if (active == 1) return;

  // The last active split of this kv head to finish merges them all (no second launch): publish the partial,
  // count, and let the block that brings the count to `active` read the others' partials from L2.
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (tid == 0) last = atomicAdd(counters + kh, 1) == active - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int stride = Dv + 4;
  float* wgt = sc;  // [G][active]: exp(m_s − M), free again after the passes above
  __shared__ float inv_l[kMaxGroup];
  for (int h = warp; h < G; h += kWarps) {
    const float* ph = part + (kh * G + h) * splits * stride;
    float M = -INFINITY;
    for (int s = lane; s < active; s += 32) M = fmaxf(M, __ldcg(ph + s * stride + Dv));
    M = warp_max(M);
    float L = 0.f;
    for (int s = lane; s < active; s += 32) {
      const float m = __ldcg(ph + s * stride + Dv);
      const float w = m == -INFINITY ? 0.f : expf(m - M);
      wgt[h * active + s] = w;
      L += w * __ldcg(ph + s * stride + Dv + 1);
    }
    L = warp_sum(L);
    if (lane == 0) inv_l[h] = L > 0.f ? 1.f / L : 0.f;
  }
  __syncthreads();
  const int per = Dv / 4;
  for (int i = tid; i < G * per; i += kThreads) {  // 4 output dims per thread, all splits' loads in flight
    const int h = i / per, d4 = i % per;
    const float4* ph = reinterpret_cast<const float4*>(part + (kh * G + h) * splits * stride) + d4;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 8
    for (int s = 0; s < active; ++s) {
      const float w = wgt[h * active + s];
      const float4 p = __ldcg(ph + s * (stride / 4));
      v.x = fmaf(w, p.x, v.x);
      v.y = fmaf(w, p.y, v.y);
      v.z = fmaf(w, p.z, v.z);
      v.w = fmaf(w, p.w, v.w);
    }
    const float il = inv_l[h];
    __nv_bfloat16* o = static_cast<__nv_bfloat16*>(out_ptr) + (kh * G + h) * Dv + 4 * d4;
    o[0] = __float2bfloat16_rn(v.x * il);
    o[1] = __float2bfloat16_rn(v.y * il);
    o[2] = __float2bfloat16_rn(v.z * il);
    o[3] = __float2bfloat16_rn(v.w * il);
  }
  if (tid == 0) counters[kh] = 0;  // ready for the next launch (graph replays included)
}

// Split counters of the last-block merge, one per kv head; zero between launches (each merge resets its own).
// Allocated on first use; the zeroing is stream-ordered, so a first use inside a graph capture records it.
int* split_counters() {
  static int* c = [] {
    void* p = nullptr;
    LATHE_CUDA_CHECK(cudaMalloc(&p, kMaxCounters * sizeof(int)));
    LATHE_CUDA_CHECK(cudaMemsetAsync(p, 0, kMaxCounters * sizeof(int), stream()));
    return static_cast<int*>(p);
  }();
  return c;
}

bool pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }
bool aligned(const void* p, uintptr_t bytes) { return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0; }

// Quantized K/V: 4/8-bit codes, a lane's 8 values in one group (and one 4- or 8-byte load), bf16 scales.
bool quantized_kv_applies(const AttentionArgs& a) {
  if (a.kv_bits == 0) return true;
  const auto group_ok = [](int64_t gs, int64_t head_size) { return gs >= 8 && gs % 8 == 0 && head_size % gs == 0; };
  return (a.kv_bits == 4 || a.kv_bits == 8) && a.k_scales && a.k_biases && a.v_scales && a.v_biases &&
         group_ok(a.k_gs, a.D) && group_ok(a.v_gs, a.Dv) && a.ksb_s0 < (int64_t{1} << 31) &&
         a.vsb_s0 < (int64_t{1} << 31);
}

}  // namespace

bool decode_attention_applies(const AttentionArgs& a) {
  const int64_t G = a.Hkv > 0 ? a.Hq / a.Hkv : 0;
  const uintptr_t kv_align = a.kv_bits ? static_cast<uintptr_t>(a.kv_bits) : 16;  // bytes of 8 values
  return a.T == 1 && a.t == DType::BF16 && a.Hkv <= kMaxCounters && G >= 1 && G <= kMaxGroup && G * a.Hkv == a.Hq &&
         pow2(a.D) && a.D >= 8 && a.D <= 256 && pow2(a.Dv) && a.Dv >= 8 && a.Dv <= 1024 && a.q_s1 % 8 == 0 &&
         a.S < (int64_t{1} << 30) && a.k_s0 < (int64_t{1} << 31) && a.v_s0 < (int64_t{1} << 31) && a.k_s0 % 8 == 0 &&
         a.k_s1 % 8 == 0 && a.v_s0 % 8 == 0 && a.v_s1 % 8 == 0 && aligned(a.q, 16) && aligned(a.k, kv_align) &&
         aligned(a.v, kv_align) && quantized_kv_applies(a);
}

int decode_attention_splits(const AttentionArgs& a) {
  const int64_t G = a.Hq / a.Hkv;  // the merge keeps G × splits weights in the scores' shared memory
  return static_cast<int>(std::clamp<int64_t>((2 * sm_count() + a.Hkv - 1) / a.Hkv, 1, kMaxGroup * kSub / G));
}

namespace {
template <int kG>
void launch_bits(const AttentionArgs& a, dim3 grid, size_t smem, const DecodeRow* rows, int splits, float* part,
                 int* counters) {
  if (a.kv_bits == 8)
    attn_decode_kernel<kG, 8><<<grid, kThreads, smem, stream()>>>(a, rows, splits, part, counters, lean_keys());
  else if (a.kv_bits == 4)
    attn_decode_kernel<kG, 4><<<grid, kThreads, smem, stream()>>>(a, rows, splits, part, counters, lean_keys());
  else
    attn_decode_kernel<kG, 0><<<grid, kThreads, smem, stream()>>>(a, rows, splits, part, counters, lean_keys());
}

// blocks_y ≤ splits: the splits that get blocks (those past every row's context would exit at once).
void launch(const AttentionArgs& a, const DecodeRow* rows, int64_t n_rows, int splits, int blocks_y, float* part) {
  const int64_t G = a.Hq / a.Hkv;
  const size_t smem = static_cast<size_t>(kMaxGroup * kSub + (kThreads / (a.Dv / 8)) * G * a.Dv) * sizeof(float);
  const dim3 grid(static_cast<unsigned>(a.Hkv), static_cast<unsigned>(blocks_y), static_cast<unsigned>(n_rows));
  int* counters = splits > 1 ? split_counters() : nullptr;
  if (G <= 2)
    launch_bits<2>(a, grid, smem, rows, splits, part, counters);
  else if (G <= 4)
    launch_bits<4>(a, grid, smem, rows, splits, part, counters);
  else
    launch_bits<8>(a, grid, smem, rows, splits, part, counters);
  check_launch("decode_attention");
}
}  // namespace

int decode_attention_active_splits(int64_t S, int splits) {
  const int s = static_cast<int>(S);  // decode_attention_applies keeps S below 2^30
  return std::clamp(active_splits(s, split_chunk(s, splits)), 1, splits);
}

// A solo launch keeps every split's block: a graph captured at a short context replays at longer ones.
void decode_attention(const AttentionArgs& a, int splits, float* part) { launch(a, nullptr, 1, splits, splits, part); }

int64_t decode_attention_max_rows(const AttentionArgs& a) { return std::min<int64_t>(kMaxCounters / a.Hkv, 65535); }

void decode_attention_rows(const AttentionArgs& a, const DecodeRow* rows, int64_t n_rows, int splits, int max_active,
                           float* part) {
  if (n_rows > 0) launch(a, rows, n_rows, splits, std::clamp(max_active, 1, splits), part);
}

}  // namespace lathe::cuda
