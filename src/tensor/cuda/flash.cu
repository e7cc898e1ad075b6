// Tiled (flash-style) prefill attention on the tensor cores, bf16 in, f32 softmax and accumulation.
// A block of 4 warps takes 64 queries of one head (16 per warp) and walks the visible key tiles of 64 keys:
// S = Q·Kᵀ and O += P·V with mma.sync m16n8k16, an online softmax in registers, K/V tiles staged in shared
// memory (rows padded by 16 bytes so fragment loads hit 32 distinct banks). Causal, sliding-window and
// softcap masks; GQA by indexing the kv head. Head sizes 64 and 128, linear key positions.
#include <cuda_bf16.h>

#include <cmath>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/kernels.h"

namespace lathe::cuda {
namespace {

constexpr int kBQ = 64, kBK = 64, kWarps = 4;

__device__ __forceinline__ void mma_bf16(float* c, const uint32_t* a, const uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ uint32_t pack_raw(__nv_bfloat16 lo, __nv_bfloat16 hi) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(lo)) | (static_cast<uint32_t>(__bfloat16_as_ushort(hi)) << 16);
}

template <int D>
__global__ void __launch_bounds__(kWarps * 32) flash_kernel(const AttentionArgs a) {
  constexpr int kPad = D + 8;  // bf16 elements per smem row
  __shared__ __align__(16) __nv_bfloat16 ks[kBK * kPad];
  __shared__ __align__(16) __nv_bfloat16 vs[kBK * kPad];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;
  const int64_t h = blockIdx.y, kh = h / (a.Hq / a.Hkv);
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kBQ;
  const __nv_bfloat16* q = static_cast<const __nv_bfloat16*>(a.q);
  const __nv_bfloat16* kg = static_cast<const __nv_bfloat16*>(a.k) + kh * a.k_s1;
  const __nv_bfloat16* vg = static_cast<const __nv_bfloat16*>(a.v) + kh * a.v_s1;

  // Q fragments straight from global memory (read once per block).
  const int64_t r0 = q0 + warp * 16 + g, r1 = r0 + 8;
  uint32_t qf[D / 16][4];
#pragma unroll
  for (int kt = 0; kt < D / 16; ++kt) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t r = (i & 1) ? r1 : r0;
      const int col = kt * 16 + 2 * c + ((i & 2) ? 8 : 0);
      qf[kt][i] = r < a.T ? *reinterpret_cast<const uint32_t*>(q + r * a.q_s0 + h * a.q_s1 + col) : 0u;
    }
  }

  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const int64_t pos_r[2] = {a.q_pos0 + r0, a.q_pos0 + r1};

  // Visible keys for the block's queries.
  const int64_t last_q = min(q0 + int64_t{kBQ}, a.T) - 1;
  int64_t j_end = a.S, j_begin = 0;
  if (a.causal) j_end = min(j_end, max(a.q_pos0 + last_q - a.k_pos0 + 1, int64_t{0}));
  if (a.window > 0) j_begin = max(int64_t{0}, a.q_pos0 + q0 - a.window + 1 - a.k_pos0);
  j_begin = j_begin / kBK * kBK;

  for (int64_t j0 = j_begin; j0 < j_end; j0 += kBK) {
    __syncthreads();
    constexpr int kVecs = kBK * D / 8;  // 16-byte vectors per tile
    for (int i = threadIdx.x; i < kVecs; i += kWarps * 32) {
      const int row = i / (D / 8), col = (i % (D / 8)) * 8;
      const int64_t j = j0 + row;
      uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
      if (j < a.S) {
        kv = *reinterpret_cast<const uint4*>(kg + j * a.k_s0 + col);
        vv = *reinterpret_cast<const uint4*>(vg + j * a.v_s0 + col);
      }
      *reinterpret_cast<uint4*>(ks + row * kPad + col) = kv;
      *reinterpret_cast<uint4*>(vs + row * kPad + col) = vv;
    }
    __syncthreads();

    // S = Q Kᵀ for this warp's 16 rows × 64 keys.
    float s[kBK / 8][4];
#pragma unroll
    for (int n = 0; n < kBK / 8; ++n) {
      s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
      for (int kt = 0; kt < D / 16; ++kt) {
        const __nv_bfloat16* kr = ks + (n * 8 + g) * kPad + kt * 16 + 2 * c;
        const uint32_t b[2] = {*reinterpret_cast<const uint32_t*>(kr), *reinterpret_cast<const uint32_t*>(kr + 8)};
        mma_bf16(s[n], qf[kt], b);
      }
    }
    // Scale, softcap, mask; row maxima (rows g and g+8 of the warp's 16).
    float mt[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kBK / 8; ++n) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int rr = i >> 1;
        const int64_t kpos = a.k_pos0 + j0 + n * 8 + 2 * c + (i & 1);
        float v = s[n][i] * a.scale;
        if (a.softcap > 0.f) v = tanhf(v / a.softcap) * a.softcap;
        const bool vis =
            kpos - a.k_pos0 < a.S && !(a.causal && kpos > pos_r[rr]) && !(a.window > 0 && pos_r[rr] - kpos >= a.window);
        v = vis ? v : -INFINITY;
        s[n][i] = v;
        mt[rr] = fmaxf(mt[rr], v);
      }
    }
    float corr[2];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      mt[rr] = fmaxf(mt[rr], __shfl_xor_sync(0xffffffffu, mt[rr], 1));
      mt[rr] = fmaxf(mt[rr], __shfl_xor_sync(0xffffffffu, mt[rr], 2));
      const float mn = fmaxf(m[rr], mt[rr]);
      corr[rr] = m[rr] == -INFINITY ? 0.f : __expf(m[rr] - mn);
      m[rr] = mn;
    }
    float ls[2] = {0.f, 0.f};
#pragma unroll
    for (int n = 0; n < kBK / 8; ++n) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int rr = i >> 1;
        const float p = s[n][i] == -INFINITY ? 0.f : __expf(s[n][i] - m[rr]);
        s[n][i] = p;
        ls[rr] += p;
      }
    }
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) l[rr] = l[rr] * corr[rr] + ls[rr];
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      o[n][0] *= corr[0];
      o[n][1] *= corr[0];
      o[n][2] *= corr[1];
      o[n][3] *= corr[1];
    }
    // O += P V: P's accumulator layout is the A-fragment layout of the next mma.
#pragma unroll
    for (int kt = 0; kt < kBK / 16; ++kt) {
      const uint32_t pa[4] = {pack_bf16(s[2 * kt][0], s[2 * kt][1]), pack_bf16(s[2 * kt][2], s[2 * kt][3]),
                              pack_bf16(s[2 * kt + 1][0], s[2 * kt + 1][1]),
                              pack_bf16(s[2 * kt + 1][2], s[2 * kt + 1][3])};
      const __nv_bfloat16* v0 = vs + (kt * 16 + 2 * c) * kPad + g;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        const __nv_bfloat16* vp = v0 + n * 8;
        const uint32_t b[2] = {pack_raw(vp[0], vp[kPad]), pack_raw(vp[8 * kPad], vp[9 * kPad])};
        mma_bf16(o[n], pa, b);
      }
    }
  }

  // Normalise and store rows g and g+8.
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 1);
    l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 2);
  }
  __nv_bfloat16* out = static_cast<__nv_bfloat16*>(a.out);
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int64_t r = rr ? r1 : r0;
    if (r >= a.T) continue;
    const float inv = l[rr] > 0.f ? 1.f / l[rr] : 0.f;
    __nv_bfloat16* orow = out + (r * a.Hq + h) * D;
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
      *reinterpret_cast<uint32_t*>(orow + n * 8 + 2 * c) = pack_bf16(o[n][2 * rr] * inv, o[n][2 * rr + 1] * inv);
  }
}

}  // namespace

bool attention_flash(const AttentionArgs& a) {
  // Worth it for prefill; decode (few queries) goes to the split-KV kernel.
  if (a.t != DType::BF16 || a.k_pos || a.T < 16 || a.D != a.Dv || (a.D != 64 && a.D != 128)) return false;
  if (a.q_s1 % 2 || a.q_s0 % 2 || a.k_s0 % 8 || a.k_s1 % 8 || a.v_s0 % 8 || a.v_s1 % 8) return false;
  const dim3 grid(static_cast<unsigned>((a.T + kBQ - 1) / kBQ), static_cast<unsigned>(a.Hq));
  if (a.D == 64)
    flash_kernel<64><<<grid, kWarps * 32, 0, stream()>>>(a);
  else
    flash_kernel<128><<<grid, kWarps * 32, 0, stream()>>>(a);
  check_launch("flash_attention");
  return true;
}

}  // namespace lathe::cuda
