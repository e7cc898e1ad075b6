// Fused per-layer kernels for decode, where each launch costs more than its bytes: q/k RMSNorm + RoPE in one
// pass over a head row, and the residual add + the next RMSNorm in one pass over the hidden row. Same f32
// arithmetic as the separate kernels, with one rounding to the output type instead of two.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "common/env.h"
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/kernels_models.h"
#include "tensor/cuda/kv_quant.cuh"

namespace lathe::cuda {
namespace {

struct Freqs {
  float inv_freq[256];
};

// One block per (t, h) row of D ≤ 1024 values, one thread per value (blockDim.x ≥ D).
template <class T>
__global__ void norm_rope_kernel(const T* __restrict__ x, T* __restrict__ out, int64_t H, int64_t D,
                                 const float* __restrict__ w, float eps, bool plus_one, const Freqs f, int half,
                                 float scaling, int64_t pos0, const int64_t* __restrict__ delta) {
  __shared__ float row[1024];
  const int64_t r = blockIdx.x;
  const int i = threadIdx.x;
  const float v = i < D ? to_f(x[r * D + i]) : 0.f;
  const float inv = 1.0f / sqrtf(block_sum(v * v) / static_cast<float>(D) + eps);
  if (i < D) row[i] = norm_gain(w, i, plus_one) * (v * inv);
  __syncthreads();
  if (i >= D) return;
  float o = row[i];
  if (i < 2 * half) {
    const int j = i < half ? i : i - half;
    float s, c;
    sincosf(static_cast<float>(pos0 + r / H + *delta) * f.inv_freq[j], &s, &c);
    c *= scaling;
    s *= scaling;
    o = i < half ? row[i] * c - row[i + half] * s : row[i] * c + row[i - half] * s;
  }
  out[r * D + i] = from_f<T>(o);
}

// Value i of a head row (buf, after its norm) rotated at position pos: one expression for every layout, so the
// fused kernels agree bitwise.
// inv_freq: the Freqs' values, in kernel parameters or staged in shared memory (the same floats).
__device__ __forceinline__ float rope_value(const float* buf, int i, const float* inv_freq, int half, float scaling,
                                            int64_t pos) {
  const int j = i < half ? i : i - half;
  float s, c;
  sincosf(static_cast<float>(pos) * inv_freq[j], &s, &c);
  c *= scaling;
  s *= scaling;
  return i < half ? buf[i] * c - buf[i + half] * s : buf[i] * c + buf[i - half] * s;
}

// A q or k head's value i after the RMSNorm (w: its gain; null: no norm) and RoPE at position pos, as the decode
// steps compute it. Every thread of the block calls it (a block sum and a barrier); buf: shared, ≥ D floats.
__device__ __forceinline__ float norm_rope_value(float v, int i, int D, const float* w, float eps, bool plus_one,
                                                 const Freqs& f, int half, float scaling, int64_t pos, float* buf) {
  float o = v;
  if (w) {
    const float inv = 1.0f / sqrtf(block_sum(v * v) / static_cast<float>(D) + eps);
    o = i < D ? norm_gain(w, i, plus_one) * (v * inv) : 0.f;
  }
  if (i < D) buf[i] = o;
  __syncthreads();
  if (i < 2 * half) o = rope_value(buf, i, f.inv_freq, half, scaling, pos);
  return o;
}

// The row an append block writes: with `rows` (a batched step), token t's slice of y and q_out, its cache
// buffers, cache row and position from rows[t], no delta; else the one decode row, shifted by the graph replay's
// delta. Both append forms call it, so they place every value alike.
template <class T>
__device__ __forceinline__ void append_row(const AppendRow* rows, int64_t t, int Hq, int Hkv, int D,
                                           const T* __restrict__& y, T* __restrict__& q_out, T* __restrict__& keys,
                                           T* __restrict__& values, int64_t& row, int64_t& pos0, int64_t& dl,
                                           const int64_t* delta) {
  dl = 0;
  if (rows) {
    const AppendRow& r = rows[t];
    y += t * (Hq + 2 * Hkv) * D;
    q_out += t * Hq * D;
    keys = static_cast<T*>(r.keys);
    values = static_cast<T*>(r.values);
    row = r.row;
    pos0 = r.pos0;
  } else {
    dl = *delta;
  }
}

// Decode step: one block per head of the stacked q|k|v row (q heads, k heads, v heads), one thread per value.
// q and k heads: optional RMSNorm, then RoPE (as norm_rope_kernel); q goes to q_out, k and v to row
// row + delta of the caches (delta: the graph replay's shift, as copy_rows). With `rows` (a batched step),
// grid y is the row: y, q_out at the row's offset, its cache buffers, row and position from rows[], no delta.
template <class T>
__global__ void qkv_rope_append_kernel(const T* __restrict__ y, T* __restrict__ q_out, T* __restrict__ keys,
                                       T* __restrict__ values, int64_t row, int Hq, int Hkv, int D, bool norm,
                                       const float* __restrict__ q_w, const float* __restrict__ k_w, float eps,
                                       bool plus_one, const Freqs f, int half, float scaling, int64_t pos0,
                                       const int64_t* __restrict__ delta, const AppendRow* __restrict__ rows) {
  __shared__ float buf[1024];
  const int b = blockIdx.x, i = threadIdx.x;
  int64_t dl;
  append_row(rows, blockIdx.y, Hq, Hkv, D, y, q_out, keys, values, row, pos0, dl, delta);
  const T* src = y + static_cast<int64_t>(b) * D;
  if (b >= Hq + Hkv) {  // a v head: copied
    if (i < D) values[((row + dl) * Hkv + (b - Hq - Hkv)) * D + i] = src[i];
    return;
  }
  const bool is_q = b < Hq;
  const float o = norm_rope_value(i < D ? to_f(src[i]) : 0.f, i, D, norm ? (is_q ? q_w : k_w) : nullptr, eps, plus_one,
                                  f, half, scaling, pos0 + dl, buf);
  if (i >= D) return;
  T* dst = is_q ? q_out + static_cast<int64_t>(b) * D : keys + ((row + dl) * Hkv + (b - Hq)) * D;
  dst[i] = from_f<T>(o);
}

// qkv_rope_append_kernel with a warp per head and kHeadWarps heads a block (head sizes 32·kPer): at prefill
// widths the block-per-head form launched 48 blocks a token, 393k for 64 prompts of 128 tokens (531 µs a layer,
// latency-bound). Bitwise the same values: the block sum's two stages are five warp sums here (lane l's partial
// of "warp" w is w's own butterfly; the second stage sums the partials as block_sum does), and the rotation is
// rope_value. Grid x: the token (rows[x], or the one decode row), grid y: head groups.
constexpr int kHeadWarps = 8;
// LATHE_CUDA_WARP_APPEND=0: the block-per-head form everywhere, for comparisons.
bool warp_append_off() {
  static const bool off = !env_switch("LATHE_CUDA_WARP_APPEND");
  return off;
}
template <class T, int kPer>
__global__ void __launch_bounds__(kHeadWarps * 32)
    qkv_rope_append_warp_kernel(const T* __restrict__ y, T* __restrict__ q_out, T* __restrict__ keys,
                                T* __restrict__ values, int64_t row, int Hq, int Hkv, bool norm,
                                const float* __restrict__ q_w, const float* __restrict__ k_w, float eps, bool plus_one,
                                const Freqs f, int half, float scaling, int64_t pos0, const int64_t* __restrict__ delta,
                                const AppendRow* __restrict__ rows) {
  constexpr int D = 32 * kPer;
  __shared__ float buf[kHeadWarps][D];
  // The frequencies staged once a block: read from the kernel parameters, lanes wanting different values take
  // turns (a 32-way replay a read), and each warp's head would read all of them again.
  __shared__ float freq[D / 2];
  for (int k = static_cast<int>(threadIdx.x); k < half; k += kHeadWarps * 32) freq[k] = f.inv_freq[k];
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int b = static_cast<int>(blockIdx.y) * kHeadWarps + warp, H = Hq + 2 * Hkv;
  if (b >= H) return;  // no block barriers below: a warp past the heads just leaves
  int64_t dl;
  append_row(rows, blockIdx.x, Hq, Hkv, D, y, q_out, keys, values, row, pos0, dl, delta);
  const T* src = y + static_cast<int64_t>(b) * D;
  if (b >= Hq + Hkv) {  // a v head: copied
    T* dst = values + ((row + dl) * Hkv + (b - Hq - Hkv)) * D;
#pragma unroll
    for (int w = 0; w < kPer; ++w) dst[32 * w + lane] = src[32 * w + lane];
    return;
  }
  const bool is_q = b < Hq;
  float v[kPer];
#pragma unroll
  for (int w = 0; w < kPer; ++w) v[w] = to_f(src[32 * w + lane]);
  const float* nw = norm ? (is_q ? q_w : k_w) : nullptr;
  if (nw) {
    float p[kPer];
#pragma unroll
    for (int w = 0; w < kPer; ++w) p[w] = v[w] * v[w];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
      for (int w = 0; w < kPer; ++w) p[w] += __shfl_xor_sync(0xffffffffu, p[w], o);
    float part = 0.f;
#pragma unroll
    for (int w = 0; w < kPer; ++w)
      if (lane == w) part = p[w];
    const float inv = 1.0f / sqrtf(warp_sum(part) / static_cast<float>(D) + eps);
#pragma unroll
    for (int w = 0; w < kPer; ++w) v[w] = norm_gain(nw, 32 * w + lane, plus_one) * (v[w] * inv);
  }
  float* hb = buf[warp];
#pragma unroll
  for (int w = 0; w < kPer; ++w) hb[32 * w + lane] = v[w];
  __syncwarp();
  T* dst = is_q ? q_out + static_cast<int64_t>(b) * D : keys + ((row + dl) * Hkv + (b - Hq)) * D;
#pragma unroll
  for (int w = 0; w < kPer; ++w) {
    const int i = 32 * w + lane;
    dst[i] = from_f<T>(i < 2 * half ? rope_value(hb, i, freq, half, scaling, pos0 + dl) : v[w]);
  }
}

// The launch of the fused append: the warp form for head sizes 64, 128 and 256, the block form otherwise.
template <class T>
void launch_qkv_rope_append(const T* y, T* q_out, T* keys, T* values, int64_t row, int64_t n_tokens, int Hq, int Hkv,
                            int D, bool norm, const float* q_w, const float* k_w, float eps, bool plus_one,
                            const Freqs& f, int half, float scaling, int64_t pos0, const int64_t* delta,
                            const AppendRow* rows) {
  const auto warp_form = [&](auto per) {
    constexpr int kPer = decltype(per)::value;
    const dim3 grid(static_cast<unsigned>(n_tokens),
                    static_cast<unsigned>((Hq + 2 * Hkv + kHeadWarps - 1) / kHeadWarps));
    qkv_rope_append_warp_kernel<T, kPer><<<grid, kHeadWarps * 32, 0, stream()>>>(
        y, q_out, keys, values, row, Hq, Hkv, norm, q_w, k_w, eps, plus_one, f, half, scaling, pos0, delta, rows);
  };
  if (D == 64 && !warp_append_off()) return warp_form(std::integral_constant<int, 2>{});
  if (D == 128 && !warp_append_off()) return warp_form(std::integral_constant<int, 4>{});
  if (D == 256 && !warp_append_off()) return warp_form(std::integral_constant<int, 8>{});
  const int threads = (D + 31) / 32 * 32;
  const dim3 grid(static_cast<unsigned>(Hq + 2 * Hkv), static_cast<unsigned>(n_tokens));
  qkv_rope_append_kernel<T><<<grid, threads, 0, stream()>>>(y, q_out, keys, values, row, Hq, Hkv, D, norm, q_w, k_w,
                                                            eps, plus_one, f, half, scaling, pos0, delta, rows);
}

// qkv_rope_append_kernel's batched form over quantized caches: q heads as there; a k or v head's values (normed
// and rotated, or copied), rounded to T as a staging row would hold them, are quantized in place — per group of
// kGs values the min and max by warp shuffles (and shared memory across the two warps of a 64-group), then
// quantize_warp_kernel's arithmetic, so codes, scales and biases are bitwise what staging the row and quantizing
// it gave — and written straight to the row's cache destinations: one launch where staging, quantizing and
// copying took four.
template <class T, int kGs>
__global__ void qkv_rope_append_q_kernel(const T* __restrict__ y, T* __restrict__ q_out, int Hq, int Hkv, int D,
                                         int bits, bool norm, const float* __restrict__ q_w,
                                         const float* __restrict__ k_w, float eps, bool plus_one, const Freqs f,
                                         int half, float scaling, const QuantAppendRow* __restrict__ rows) {
  __shared__ float buf[1024];
  __shared__ float gmin[32], gmax[32];
  const int b = blockIdx.x, i = threadIdx.x, lane = i & 31, warp = i >> 5;
  const QuantAppendRow& r = rows[blockIdx.y];
  y += static_cast<int64_t>(blockIdx.y) * (Hq + 2 * Hkv) * D;
  const T* src = y + static_cast<int64_t>(b) * D;
  const bool is_q = b < Hq, is_v = b >= Hq + Hkv;
  const float v = i < D ? to_f(src[i]) : 0.f;
  const float o = is_v ? v
                       : norm_rope_value(v, i, D, norm ? (is_q ? q_w : k_w) : nullptr, eps, plus_one, f, half, scaling,
                                         r.pos0, buf);
  if (is_q) {
    if (i < D) q_out[(static_cast<int64_t>(blockIdx.y) * Hq + b) * D + i] = from_f<T>(o);
    return;
  }
  // Threads past D (D is a multiple of kGs, so whole warps) only take part in the block's barriers.
  const float x = to_f(from_f<T>(o));
  float mn = x, mx = x;
  for (int k = 16; k > 0; k >>= 1) {
    mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, k));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, k));
  }
  if constexpr (kGs == 64) {  // the group's two warps meet in shared memory
    if (lane == 0) {
      gmin[warp] = mn;
      gmax[warp] = mx;
    }
    __syncthreads();
    mn = fminf(gmin[warp & ~1], gmin[warp | 1]);
    mx = fmaxf(gmax[warp & ~1], gmax[warp | 1]);
  }
  if (i >= D) return;
  const float n_bins = static_cast<float>((1 << bits) - 1);
  float scale, bias;
  affine_scale_bias(mn, mx, n_bins, scale, bias);
  const T s_stored = from_f<T>(scale), b_stored = from_f<T>(bias);
  const int h = is_v ? b - Hq - Hkv : b - Hq;
  const int groups = D / kGs, part = is_v ? 3 : 0;
  if (i % kGs == 0) {
    static_cast<T*>(r.dst[part + 1])[h * groups + i / kGs] = s_stored;
    static_cast<T*>(r.dst[part + 2])[h * groups + i / kGs] = b_stored;
  }
  const int epw = 32 / bits;
  uint32_t word = affine_code(x, to_f(s_stored), to_f(b_stored), n_bins) << (bits * (i % epw));
  for (int k = 1; k < epw; k <<= 1) word |= __shfl_xor_sync(0xffffffffu, word, k);
  if (i % epw == 0) static_cast<uint32_t*>(r.dst[part])[(h * D + i) / epw] = word;
}

// One block per row. Each thread keeps its kPer values in registers between the sum of squares and the
// output, and issues all its loads before any arithmetic: a decode row (one block) is latency-bound, and the
// earlier loop (load, add, store, repeat; then re-read) paid a memory round trip per element stride.
template <class TH, class TB, class TO, int kPer>
__global__ void add_norm_kernel(TH* h, const TB* __restrict__ b, TO* __restrict__ out, int64_t D,
                                const float* __restrict__ w, float eps, bool plus_one) {
  pdl_trigger();  // a decode GEMV usually follows: let it start fetching its weights
  const int64_t r = blockIdx.x;
  TH* hr = h + r * D;
  const TB* br = b + r * D;
  float hv[kPer], bv[kPer], gv[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t i = threadIdx.x + k * blockDim.x;
    hv[k] = i < D ? to_f(hr[i]) : 0.f;
    bv[k] = i < D ? to_f(br[i]) : 0.f;
    gv[k] = i < D ? norm_gain(w, i, plus_one) : 1.0f;  // loaded before the reduction, not after
  }
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t i = threadIdx.x + k * blockDim.x;
    const TH sum = from_f<TH>(hv[k] + bv[k]);
    hv[k] = to_f(sum);
    if (i < D) hr[i] = sum;
    ss += hv[k] * hv[k];
  }
  const float inv = 1.0f / sqrtf(block_sum(ss) / static_cast<float>(D) + eps);
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t i = threadIdx.x + k * blockDim.x;
    if (i < D) out[r * D + i] = from_f<TO>(gv[k] * (hv[k] * inv));
  }
}

}  // namespace

void rms_norm_rope(const void* x, void* out, DType t, int64_t T_, int64_t H, int64_t D, const float* w, float eps,
                   bool plus_one, const float* inv_freq, int dims, float scaling, int64_t pos0) {
  const int half = dims / 2;
  if (D > 1024 || half > 256 || 2 * half > D)
    throw Error(ErrorKind::Unsupported, "rms_norm_rope: head above 1024 or rotary dims above 512 on CUDA");
  if (T_ * H == 0) return;
  Freqs f{};
  std::memcpy(f.inv_freq, inv_freq, sizeof(float) * static_cast<size_t>(half));
  const int threads = static_cast<int>((D + 31) / 32 * 32);
  LATHE_DISPATCH_ACT(t, "rms_norm_rope", T,
                     norm_rope_kernel<T><<<static_cast<unsigned>(T_ * H), threads, 0, stream()>>>(
                         static_cast<const T*>(x), static_cast<T*>(out), H, D, w, eps, plus_one, f, half, scaling, pos0,
                         step_delta()));
  check_launch("rms_norm_rope");
}

void qkv_rope_append(const void* y, void* q_out, void* keys, void* values, DType t, int64_t row, int64_t Hq,
                     int64_t Hkv, int64_t D, bool norm, const float* q_w, const float* k_w, float eps, bool plus_one,
                     const float* inv_freq, int dims, float scaling, int64_t pos0) {
  const int half = dims / 2;
  if (D > 1024 || half > 256 || 2 * half > D)
    throw Error(ErrorKind::Unsupported, "qkv_rope_append: head above 1024 or rotary dims above 512 on CUDA");
  Freqs f{};
  std::memcpy(f.inv_freq, inv_freq, sizeof(float) * static_cast<size_t>(half));
  LATHE_DISPATCH_ACT(t, "qkv_rope_append", T,
                     launch_qkv_rope_append<T>(static_cast<const T*>(y), static_cast<T*>(q_out), static_cast<T*>(keys),
                                               static_cast<T*>(values), row, 1, static_cast<int>(Hq),
                                               static_cast<int>(Hkv), static_cast<int>(D), norm, q_w, k_w, eps,
                                               plus_one, f, half, scaling, pos0, step_delta(), nullptr));
  check_launch("qkv_rope_append");
}

void qkv_rope_append_rows(const void* y, void* q_out, const AppendRow* rows, int64_t n_rows, DType t, int64_t Hq,
                          int64_t Hkv, int64_t D, bool norm, const float* q_w, const float* k_w, float eps,
                          bool plus_one, const float* inv_freq, int dims, float scaling) {
  const int half = dims / 2;
  if (D > 1024 || half > 256 || 2 * half > D)
    throw Error(ErrorKind::Unsupported, "qkv_rope_append: head above 1024 or rotary dims above 512 on CUDA");
  if (n_rows == 0) return;
  Freqs f{};
  std::memcpy(f.inv_freq, inv_freq, sizeof(float) * static_cast<size_t>(half));
  LATHE_DISPATCH_ACT(t, "qkv_rope_append_rows", T,
                     launch_qkv_rope_append<T>(static_cast<const T*>(y), static_cast<T*>(q_out), nullptr, nullptr, 0,
                                               n_rows, static_cast<int>(Hq), static_cast<int>(Hkv), static_cast<int>(D),
                                               norm, q_w, k_w, eps, plus_one, f, half, scaling, 0, nullptr, rows));
  check_launch("qkv_rope_append_rows");
}

bool qkv_rope_append_quantized_covers(int64_t D, int bits, int group_size) {
  return (bits == 4 || bits == 8) && (group_size == 32 || group_size == 64) && D % group_size == 0 && D <= 1024;
}

void qkv_rope_append_quantized_rows(const void* y, void* q_out, const QuantAppendRow* rows, int64_t n_rows, DType t,
                                    int64_t Hq, int64_t Hkv, int64_t D, int bits, int group_size, bool norm,
                                    const float* q_w, const float* k_w, float eps, bool plus_one, const float* inv_freq,
                                    int dims, float scaling) {
  const int half = dims / 2;
  if (!qkv_rope_append_quantized_covers(D, bits, group_size) || half > 256 || 2 * half > D)
    throw Error(ErrorKind::Unsupported, "qkv_rope_append_quantized_rows: geometry not covered on CUDA");
  if (n_rows == 0) return;
  Freqs f{};
  std::memcpy(f.inv_freq, inv_freq, sizeof(float) * static_cast<size_t>(half));
  const int threads = static_cast<int>((D + 31) / 32 * 32);
  const dim3 grid(static_cast<unsigned>(Hq + 2 * Hkv), static_cast<unsigned>(n_rows));
  LATHE_DISPATCH_ACT(t, "qkv_rope_append_quantized_rows", T, {
    auto* kernel = group_size == 32 ? qkv_rope_append_q_kernel<T, 32> : qkv_rope_append_q_kernel<T, 64>;
    kernel<<<grid, threads, 0, stream()>>>(static_cast<const T*>(y), static_cast<T*>(q_out), static_cast<int>(Hq),
                                           static_cast<int>(Hkv), static_cast<int>(D), bits, norm, q_w, k_w, eps,
                                           plus_one, f, half, scaling, rows);
  });
  check_launch("qkv_rope_append_quantized_rows");
}

void add_rms_norm(void* h, DType ht, const void* b, DType bt, void* out, DType ot, int64_t rows, int64_t D,
                  const float* w, float eps, bool plus_one) {
  if (rows == 0) return;
  const NormRowLaunch l = norm_row_launch(D, "add_rms_norm");
  LATHE_DISPATCH_ACT(ht, "add_rms_norm", TH, {
    LATHE_DISPATCH_ACT(bt, "add_rms_norm", TB, {
      LATHE_DISPATCH_ACT(ot, "add_rms_norm", TO, {
        auto* kernel = l.wide ? add_norm_kernel<TH, TB, TO, 32> : add_norm_kernel<TH, TB, TO, 8>;
        kernel<<<static_cast<unsigned>(rows), l.threads, 0, stream()>>>(static_cast<TH*>(h), static_cast<const TB*>(b),
                                                                        static_cast<TO*>(out), D, w, eps, plus_one);
      });
    });
  });
  check_launch("add_rms_norm");
}

}  // namespace lathe::cuda
