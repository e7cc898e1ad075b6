// Decode attention for wide batches (decode_attention_wide.h): one block per (row, kv head), no key splits.
// The split kernel (decode_attention.cu) spreads one row over the chip in blocks of ≥ 16 keys, each a long
// chain of dependent steps, and merges them: at 64 rows that was 6,656 tiny blocks a layer and 225 µs, 65% of
// a Qwen3-4B step (H200), at ~5% of the copy rate. Here the rows fill the chip; each warp walks tiles of 32
// keys with its own running max and sum:
//   1. scores: a lane per key, its K row read as 16-byte chunks against the group's queries in shared memory;
//   2. softmax: the tile's max and sum per head by warp shuffles, the warp's accumulators rescaled;
//   3. p·V: each lane owns Dv/32 output dims of every head; a key's probability is broadcast by shuffle.
// The block's four warps then merge their (max, sum, acc) in shared memory.
// Quantized K/V (4/8-bit MLX codes, bf16 scale and bias per group) are read in place: keys 8 codes at a time,
// value codes copied to shared memory with their rows' scales and biases. Each value goes through
// dequantize_any's arithmetic (fmaf(scale, code, bias), rounded to bf16), so the output is bitwise this kernel's
// over a dequantized copy, which wide steps made before (every row's whole cache, every layer, every step).
#include <cfloat>
#include <cmath>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/decode_attention_wide.h"
#include "tensor/cuda/kv_dequant.cuh"

namespace lathe::cuda {
namespace {

constexpr int kThreads = 128, kWarps = kThreads / 32, kTile = 32;

// The codes of 8 consecutive features [f, f + 8) of K row j (kBits 4 or 8) whose group holds all 8, and that
// group's scale and bias: loaded ahead, dequantized at use (dequant8).
template <int kBits>
__device__ __forceinline__ void load_k8(const AttentionArgs& a, const DecodeRow& row, int64_t kh, int64_t j, int f,
                                        uint2& w, float& sc, float& bi) {
  const int64_t at = j * a.k_s0 + kh * a.k_s1 + f;  // in codes
  const int64_t g = j * a.ksb_s0 + kh * a.ksb_s1 + f / a.k_gs;
  sc = __bfloat162float(static_cast<const __nv_bfloat16*>(row.k_scales)[g]);
  bi = __bfloat162float(static_cast<const __nv_bfloat16*>(row.k_biases)[g]);
  if constexpr (kBits == 8)
    w = *reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(row.k) + at);
  else
    w = make_uint2(*reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(row.k) + at / 2), 0u);
}

// kDPL codes from shared memory (kBits wide, value 2k in the low nibble of byte k) as floats with one scale/bias.
template <int kDPL, int kBits>
__device__ __forceinline__ void load_v_codes(const uint8_t* p, float sc, float bi, float* f) {
  constexpr int kBytes = kDPL * kBits / 8;
  uint32_t w[kBytes > 4 ? 2 : 1];
  if constexpr (kBytes == 8) {
    const uint2 x = *reinterpret_cast<const uint2*>(p);
    w[0] = x.x;
    w[1] = x.y;
  } else if constexpr (kBytes == 4) {
    w[0] = *reinterpret_cast<const uint32_t*>(p);
  } else if constexpr (kBytes == 2) {
    w[0] = *reinterpret_cast<const uint16_t*>(p);
  } else {
    w[0] = *p;
  }
#pragma unroll
  for (int e = 0; e < kDPL; e += 2) {
    const int per_word = 32 / kBits;
    dequant2(sc, bi, code_bits<kBits>(w[e / per_word], e % per_word),
             code_bits<kBits>(w[(e + 1) / per_word], (e + 1) % per_word), f[e], f[e + 1]);
  }
}

// kDPL output dims per lane (Dv / 32) as bf16, read from one V row.
template <int kDPL>
__device__ __forceinline__ void load_v(const __nv_bfloat16* p, float* f) {
  if constexpr (kDPL == 8) {
    bf16x8(*reinterpret_cast<const uint4*>(p), f);
  } else if constexpr (kDPL == 4) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    f[0] = __uint_as_float(v.x << 16);
    f[1] = __uint_as_float(v.x & 0xffff0000u);
    f[2] = __uint_as_float(v.y << 16);
    f[3] = __uint_as_float(v.y & 0xffff0000u);
  } else {
    const uint32_t v = *reinterpret_cast<const uint32_t*>(p);
    f[0] = __uint_as_float(v << 16);
    f[1] = __uint_as_float(v & 0xffff0000u);
  }
}

// Shared memory: the warps' V tiles (bf16 rows, or codes then each row's scales and biases), reused for their
// accumulators at the merge, then queries and (max, sum).
__host__ __device__ inline int64_t vrow_bytes(int64_t Dv, int bits) { return bits ? Dv * bits / 8 : Dv * 2; }
__host__ __device__ inline int64_t tile_bytes(int64_t G, int64_t Dv, int bits, int64_t v_groups) {
  const int64_t v = int64_t{kWarps} * kTile * (vrow_bytes(Dv, bits) + (bits ? 4 * v_groups : 0));
  const int64_t acc = int64_t{kWarps} * G * Dv * 4;
  return v > acc ? v : acc;
}

// kG: the largest group served (query heads per kv head); kDPL: Dv / 32; kBits: 0 (bf16 K/V) or the codes' width.
template <int kG, int kDPL, int kBits>
__global__ void __launch_bounds__(kThreads)
    wide_decode_kernel(const AttentionArgs a, const DecodeRow* __restrict__ rows) {
  extern __shared__ float4 smem4[];
  const int G = static_cast<int>(a.Hq / a.Hkv), D = static_cast<int>(a.D), Dv = static_cast<int>(a.Dv);
  const int v_groups = kBits ? static_cast<int>(Dv / a.v_gs) : 0;
  const int vrow = static_cast<int>(vrow_bytes(Dv, kBits));
  char* smem = reinterpret_cast<char*>(smem4);
  // [kWarps][kTile] V rows of each warp's tile (bf16 values, or codes), then for codes [kWarps][kTile][v_groups]
  // scales and biases
  uint8_t* vtiles = reinterpret_cast<uint8_t*>(smem);
  auto* vsb = reinterpret_cast<__nv_bfloat16*>(smem + int64_t{kWarps} * kTile * vrow);
  float* wacc = reinterpret_cast<float*>(smem);  // [kWarps][G][Dv] the warps' accumulators, after
  float* qs = reinterpret_cast<float*>(smem + tile_bytes(G, Dv, kBits, v_groups));  // [G][D] scaled queries
  float* wm = qs + G * D;        // [kWarps][G] each warp's running max
  float* wl = wm + kWarps * kG;  // [kWarps][G] and sum
  const int kh = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const DecodeRow& row = rows[blockIdx.y];
  const int S = static_cast<int>(row.S);
  const int64_t qpos = row.q_pos0, k_pos0 = row.k_pos0;
  const int64_t* k_pos = row.k_pos;
  int j0 = 0, j1 = S;
  if (!k_pos) {  // linear positions: the visible keys are one range
    const int64_t last = qpos - k_pos0 + 1, first = qpos - a.window + 1 - k_pos0;
    if (a.causal && last < j1) j1 = static_cast<int>(last > 0 ? last : 0);
    if (a.window > 0 && first > j0) j0 = static_cast<int>(first);
  }

  const auto* qb = static_cast<const __nv_bfloat16*>(row.q) + kh * G * a.q_s1;
  for (int i = tid; i < G * D; i += kThreads) {
    const int h = i / D, d = i % D;
    qs[i] = __bfloat162float(qb[h * a.q_s1 + d]) * a.scale;
  }
  __syncthreads();

  float m[kG], l[kG], acc[kG][kDPL];
#pragma unroll
  for (int h = 0; h < kG; ++h) {
    m[h] = -INFINITY;
    l[h] = 0.f;
#pragma unroll
    for (int e = 0; e < kDPL; ++e) acc[h][e] = 0.f;
  }
  const auto* kbase = static_cast<const __nv_bfloat16*>(row.k) + kh * a.k_s1;  // bf16 K rows
  // V rows in bytes: a row's first byte is vbase + j · v_row (bf16 values or codes alike).
  const int64_t v_row = kBits ? a.v_s0 * kBits / 8 : a.v_s0 * 2;
  const auto* vbase = static_cast<const uint8_t*>(row.v) + (kBits ? kh * a.v_s1 * kBits / 8 : kh * a.v_s1 * 2);
  uint8_t* vt = vtiles + warp * kTile * vrow;
  __nv_bfloat16* vsbt = vsb + warp * kTile * 2 * v_groups;  // per tile row: v_groups scales, then biases
  const int chunks = vrow / 16;                             // 16-byte pieces of a V row
  for (int base = j0 + warp * kTile; base < j1; base += kWarps * kTile) {
    const int j = base + lane, n = min(kTile, j1 - base);
    // The tile's V rows start on their way to shared memory; the scores and softmax run meanwhile.
    for (int c = lane; c < n * chunks; c += 32) {
      const int r = c / chunks, o = (c % chunks) * 16;
      cp_async16(vt + r * vrow + o, vbase + static_cast<int64_t>(base + r) * v_row + o);
    }
    cp_async_commit();
    if constexpr (kBits != 0) {  // this lane's key's value scales and biases
      if (lane < n) {
        const int64_t g = static_cast<int64_t>(j) * a.vsb_s0 + kh * a.vsb_s1;
        for (int x = 0; x < v_groups; ++x) {
          vsbt[lane * 2 * v_groups + x] = static_cast<const __nv_bfloat16*>(row.v_scales)[g + x];
          vsbt[lane * 2 * v_groups + v_groups + x] = static_cast<const __nv_bfloat16*>(row.v_biases)[g + x];
        }
      }
    }
    // 1. This lane's key against every head of the group, 8 features at a time, 8 chunks in flight.
    float s[kG];
#pragma unroll
    for (int h = 0; h < kG; ++h) s[h] = 0.f;
    if (lane < n) {
      for (int c0 = 0; c0 < D; c0 += 64) {
        // 8 raw chunks in flight (bf16, or codes with their groups' scales and biases), widened at use.
        uint4 kc[kBits ? 1 : 8];
        uint2 kw[kBits ? 8 : 1];
        float ksc[kBits ? 8 : 1], kbi[kBits ? 8 : 1];
#pragma unroll
        for (int c = 0; c < 8; ++c) {
          if constexpr (kBits == 0)
            kc[c] = c0 + 8 * c < D
                        ? *reinterpret_cast<const uint4*>(kbase + static_cast<int64_t>(j) * a.k_s0 + c0 + 8 * c)
                        : make_uint4(0, 0, 0, 0);
          else if (c0 + 8 * c < D)
            load_k8<kBits>(a, row, kh, j, c0 + 8 * c, kw[c], ksc[c], kbi[c]);
        }
#pragma unroll
        for (int c = 0; c < 8; ++c) {
          if (c0 + 8 * c >= D) break;
          float kb[8];
          const float* kf = kb;
          if constexpr (kBits == 0)
            bf16x8(kc[c], kb);
          else
            dequant8<kBits>(kw[c], ksc[c], kbi[c], kb);
#pragma unroll
          for (int h = 0; h < kG; ++h) {
            if (h < G) {
              const float4 q0 = *reinterpret_cast<const float4*>(qs + h * D + c0 + 8 * c);
              const float4 q1 = *reinterpret_cast<const float4*>(qs + h * D + c0 + 8 * c + 4);
              s[h] = fmaf(q0.x, kf[0], s[h]);
              s[h] = fmaf(q0.y, kf[1], s[h]);
              s[h] = fmaf(q0.z, kf[2], s[h]);
              s[h] = fmaf(q0.w, kf[3], s[h]);
              s[h] = fmaf(q1.x, kf[4], s[h]);
              s[h] = fmaf(q1.y, kf[5], s[h]);
              s[h] = fmaf(q1.z, kf[6], s[h]);
              s[h] = fmaf(q1.w, kf[7], s[h]);
            }
          }
        }
      }
    }
    bool vis = lane < n;
    if (vis && k_pos) {
      const int64_t kp = k_pos[j];
      vis = !(a.causal && kp > qpos) && !(a.window > 0 && qpos - kp >= a.window);
    }
    // 2. Online softmax over the tile, per head.
    float p[kG];
#pragma unroll
    for (int h = 0; h < kG; ++h) {
      if (h >= G) continue;
      float x = s[h];
      if (a.softcap > 0.f) x = tanhf(x / a.softcap) * a.softcap;
      x = vis ? x : -INFINITY;
      const float mn = fmaxf(m[h], warp_max(x));
      p[h] = mn == -INFINITY ? 0.f : expf(x - mn);
      const float corr = m[h] == -INFINITY ? 0.f : expf(m[h] - mn);
      l[h] = l[h] * corr + warp_sum(p[h]);
      m[h] = mn;
#pragma unroll
      for (int e = 0; e < kDPL; ++e) acc[h][e] *= corr;
    }
    // 3. p·V over the tile's keys from shared memory.
    cp_async_wait<0>();
    __syncwarp();
    for (int i = 0; i < n; ++i) {
      float vf[kDPL];
      if constexpr (kBits == 0) {
        load_v<kDPL>(reinterpret_cast<const __nv_bfloat16*>(vt + i * vrow) + lane * kDPL, vf);
      } else {
        const int g = lane * kDPL / static_cast<int>(a.v_gs);
        const __nv_bfloat16* sb = vsbt + i * 2 * v_groups;
        load_v_codes<kDPL, kBits>(vt + i * vrow + lane * kDPL * kBits / 8, __bfloat162float(sb[g]),
                                  __bfloat162float(sb[v_groups + g]), vf);
      }
#pragma unroll
      for (int h = 0; h < kG; ++h) {
        if (h >= G) continue;
        const float ph = __shfl_sync(0xffffffffu, p[h], i);
#pragma unroll
        for (int e = 0; e < kDPL; ++e) acc[h][e] = fmaf(ph, vf[e], acc[h][e]);
      }
    }
    __syncwarp();  // the next tile's copies overwrite vt
  }

  // The warps' partial results, merged by the block (their accumulators over the V tiles).
  __syncthreads();
#pragma unroll
  for (int h = 0; h < kG; ++h) {
    if (h >= G) continue;
    if (lane == 0) {
      wm[warp * kG + h] = m[h];
      wl[warp * kG + h] = l[h];
    }
#pragma unroll
    for (int e = 0; e < kDPL; ++e) wacc[(warp * G + h) * Dv + lane * kDPL + e] = acc[h][e];
  }
  __syncthreads();
  auto* out = static_cast<__nv_bfloat16*>(a.out) + (blockIdx.y * a.Hq + kh * G) * a.Dv;
  for (int i = tid; i < G * Dv; i += kThreads) {
    const int h = i / Dv, d = i % Dv;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, wm[w * kG + h]);
    float num = 0.f, den = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float mw = wm[w * kG + h];
      const float c = mw == -INFINITY ? 0.f : expf(mw - M);
      num = fmaf(c, wacc[(w * G + h) * Dv + d], num);
      den = fmaf(c, wl[w * kG + h], den);
    }
    out[i] = __float2bfloat16_rn(den > 0.f ? num / den : 0.f);
  }
}

template <int kG, int kDPL, int kBits>
void launch_shape(const AttentionArgs& a, const DecodeRow* rows, int64_t n_rows, size_t smem) {
  static const bool opted = [] {  // above 48 KiB (8 heads of 256) a kernel must ask for its shared memory
    LATHE_CUDA_CHECK(cudaFuncSetAttribute(wide_decode_kernel<kG, kDPL, kBits>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(tile_bytes(kG, 32 * kDPL, 0, 0)) + 16 * 1024));
    return true;
  }();
  (void)opted;
  const dim3 grid(static_cast<unsigned>(a.Hkv), static_cast<unsigned>(n_rows));
  wide_decode_kernel<kG, kDPL, kBits><<<grid, kThreads, smem, stream()>>>(a, rows);
}

template <int kG, int kBits>
void launch_dims(const AttentionArgs& a, const DecodeRow* rows, int64_t n_rows, size_t smem) {
  if (a.Dv == 256)
    launch_shape<kG, 8, kBits>(a, rows, n_rows, smem);
  else if (a.Dv == 128)
    launch_shape<kG, 4, kBits>(a, rows, n_rows, smem);
  else
    launch_shape<kG, 2, kBits>(a, rows, n_rows, smem);
}

template <int kG>
void launch_group(const AttentionArgs& a, const DecodeRow* rows, int64_t n_rows, size_t smem) {
  if (a.kv_bits == 8)
    launch_dims<kG, 8>(a, rows, n_rows, smem);
  else if (a.kv_bits == 4)
    launch_dims<kG, 4>(a, rows, n_rows, smem);
  else
    launch_dims<kG, 0>(a, rows, n_rows, smem);
}

size_t smem_bytes(const AttentionArgs& a) {
  const int64_t G = a.Hq / a.Hkv;
  const int64_t v_groups = a.kv_bits ? a.Dv / a.v_gs : 0;
  return static_cast<size_t>(tile_bytes(G, a.Dv, static_cast<int>(a.kv_bits), v_groups) +
                             (G * a.D + 2 * kWarps * 8) * int64_t{sizeof(float)});
}

// Quantized K/V: 4/8-bit codes with bf16 scales and biases, 8 features of a key (and a lane's kDPL values) in one
// group, whole V rows of 16-byte pieces.
bool quantized_wide_applies(const AttentionArgs& a) {
  if (a.kv_bits == 0) return true;
  const auto group_ok = [](int64_t gs, int64_t n) { return gs >= 8 && gs % 8 == 0 && n % gs == 0; };
  return (a.kv_bits == 4 || a.kv_bits == 8) && a.k_scales && a.k_biases && a.v_scales && a.v_biases &&
         group_ok(a.k_gs, a.D) && group_ok(a.v_gs, a.Dv) && (a.Dv * a.kv_bits / 8) % 16 == 0 &&
         (a.v_s0 * a.kv_bits / 8) % 16 == 0 && (a.v_s1 * a.kv_bits / 8) % 16 == 0 && a.Dv / a.v_gs <= 32;
}
}  // namespace

bool decode_attention_wide_applies(const AttentionArgs& a, int64_t n_rows) {
  const int64_t G = a.Hkv > 0 ? a.Hq / a.Hkv : 0;
  // Enough (row, kv head) blocks to cover the chip; fewer leave it idle and the split kernel does better.
  return n_rows * a.Hkv >= sm_count() && n_rows <= 65535 && a.t == DType::BF16 && quantized_wide_applies(a) && G >= 1 &&
         G <= 8 && G * a.Hkv == a.Hq && a.D % 8 == 0 && a.D >= 8 && a.D <= 256 &&
         (a.Dv == 64 || a.Dv == 128 || a.Dv == 256) && a.q_s1 % 8 == 0 && a.k_s0 % 8 == 0 && a.k_s1 % 8 == 0 &&
         a.v_s0 % 8 == 0 && a.v_s1 % 8 == 0 && a.k_s0 < (int64_t{1} << 31) && a.v_s0 < (int64_t{1} << 31);
}

void decode_attention_wide(const AttentionArgs& a, const DecodeRow* rows, int64_t n_rows) {
  if (n_rows <= 0) return;
  const int64_t G = a.Hq / a.Hkv;
  if (G <= 2)
    launch_group<2>(a, rows, n_rows, smem_bytes(a));
  else if (G <= 4)
    launch_group<4>(a, rows, n_rows, smem_bytes(a));
  else
    launch_group<8>(a, rows, n_rows, smem_bytes(a));
  check_launch("decode_attention_wide");
}

}  // namespace lathe::cuda
