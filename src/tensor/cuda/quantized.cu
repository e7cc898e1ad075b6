// MLX affine-quantized weights on the device: the decode GEMV (each packed byte read once, dequantized in
// registers), dequantization to a dense scratch for the prefill GEMM, and the quantized embedding gather.
//
// This SIMT GEMV serves f32 activations (and any case gemv_mma.cu does not cover).
// GEMV layout: a warp owns kRows output rows; lane l walks 16-byte chunks l, l+32, ... of the packed row
// (32 four-bit or 16 eight-bit values, always inside one group since groups are ≥ 32 values). Each x chunk is
// loaded once and reused for the warp's rows. Sum_k x_k (s q_k + b) = s·Σ q_k x_k + b·Σ x_k per chunk.
// Integer->float conversions are slow on the GPU, so codes become floats through exponent tricks (below);
// index math stays 32-bit and the group index is a shift.
#include <cuda_bf16.h>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/gemv_mma.h"
#include "tensor/cuda/kernels.h"

namespace lathe::cuda {
namespace {

constexpr int kRows = 4;              // rows per warp: each x chunk is converted once for 4 rows
constexpr int kWarps = 4;             // warps per block
constexpr float kMagic = 8388608.0f;  // 2^23

// 0x4B0000qq as a float is 2^23 + q: one PRMT and one FADD instead of a slow integer->float conversion.
__device__ __forceinline__ float byte_as_float(uint32_t v, uint32_t b) {
  return __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7540u | b)) - kMagic;
}

__device__ __forceinline__ float load_sb(const void* p, bool bf16, int64_t i) {
  return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]) : static_cast<const float*>(p)[i];
}

// Loads kN consecutive activations starting at x + i as floats.
template <int kN>
__device__ __forceinline__ void load_x(const float* x, int i, float* out) {
  const float4* p = reinterpret_cast<const float4*>(x + i);
#pragma unroll
  for (int j = 0; j < kN / 4; ++j) {
    const float4 v = __ldg(p + j);
    out[4 * j] = v.x;
    out[4 * j + 1] = v.y;
    out[4 * j + 2] = v.z;
    out[4 * j + 3] = v.w;
  }
}
template <int kN>
__device__ __forceinline__ void load_x(const __nv_bfloat16* x, int i, float* out) {
  const uint4* p = reinterpret_cast<const uint4*>(x + i);
#pragma unroll
  for (int j = 0; j < kN / 8; ++j) {
    const uint4 v = __ldg(p + j);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      out[8 * j + 2 * k] = __uint_as_float(w[k] << 16);
      out[8 * j + 2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
    }
  }
}

// 4-bit: Σ_e (128 + q_e) x_e over one 16-byte chunk (32 values). (w >> 4j) & 0x000F000F | 0x43004300 holds
// values j and j + 4 of a word as two bf16 numbers 128 + q; widening a bf16 to f32 is one shift or mask. The
// caller removes the 128·Σx offset (f32 keeps ~1e-6 relative precision after that subtraction).
__device__ __forceinline__ float chunk_dot4(const uint4 wv, const float* xv) {
  const uint32_t words[4] = {wv.x, wv.y, wv.z, wv.w};
  float d0 = 0.f, d1 = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t v = ((words[i] >> (4 * j)) & 0x000F000Fu) | 0x43004300u;
      d0 = fmaf(__uint_as_float(v << 16), xv[i * 8 + j], d0);
      d1 = fmaf(__uint_as_float(v & 0xffff0000u), xv[i * 8 + j + 4], d1);
    }
  }
  return d0 + d1;
}

// 8-bit: Σ_e q_e x_e over one 16-byte chunk (16 values).
__device__ __forceinline__ float chunk_dot8(const uint4 wv, const float* xv) {
  const uint32_t words[4] = {wv.x, wv.y, wv.z, wv.w};
  float d0 = 0.f, d1 = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    d0 = fmaf(byte_as_float(words[i], 0), xv[i * 4], d0);
    d1 = fmaf(byte_as_float(words[i], 1), xv[i * 4 + 1], d1);
    d0 = fmaf(byte_as_float(words[i], 2), xv[i * 4 + 2], d0);
    d1 = fmaf(byte_as_float(words[i], 3), xv[i * 4 + 3], d1);
  }
  return d0 + d1;
}

template <int kBits, class TX, class TY>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(const QuantView q, int group_shift, const TX* __restrict__ x,
                                                           TY* __restrict__ y, const float* __restrict__ bias) {
  constexpr int kPerChunk = 128 / kBits;
  const int lane = threadIdx.x & 31;
  const int row0 = (blockIdx.x * kWarps + (threadIdx.x >> 5)) * kRows;
  const int rows = static_cast<int>(q.rows);
  if (row0 >= rows) return;
  const int chunks = static_cast<int>(q.cols / kPerChunk);
  const uint4* wrow[kRows];
  int64_t sbrow[kRows];
  float acc[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int n = min(row0 + r, rows - 1);  // duplicate the last row rather than branch
    wrow[r] = reinterpret_cast<const uint4*>(q.w + n * q.w_stride);
    sbrow[r] = n * q.sb_stride;
    acc[r] = 0.f;
  }
#pragma unroll 2
  for (int c = lane; c < chunks; c += 32) {
    uint4 wv[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) wv[r] = __ldg(wrow[r] + c);
    float xv[kPerChunk];
    load_x<kPerChunk>(x, c * kPerChunk, xv);
    float xs = 0.f;
#pragma unroll
    for (int e = 0; e < kPerChunk; ++e) xs += xv[e];
    const int g = (c * kPerChunk) >> group_shift;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float s = load_sb(q.scales, q.sb_bf16, sbrow[r] + g);
      const float b = load_sb(q.biases, q.sb_bf16, sbrow[r] + g);
      if constexpr (kBits == 4)
        acc[r] += s * chunk_dot4(wv[r], xv) + (b - 128.f * s) * xs;
      else
        acc[r] += s * chunk_dot8(wv[r], xv) + b * xs;
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float v = warp_sum(acc[r]);
    const int n = row0 + r;
    if (lane == 0 && n < rows) y[n] = from_f<TY>(bias ? v + bias[n] : v);
  }
}

template <class TO>
__global__ void dequant_kernel(const QuantView q, int64_t row0, int64_t n, TO* __restrict__ out) {
  const int64_t W = q.cols * q.bits / 32;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n * W) return;
  const int64_t r = i / W, c = i % W;
  const int epw = 32 / q.bits;
  const uint32_t mask = (1u << q.bits) - 1u;
  const uint32_t word = q.w[(row0 + r) * q.w_stride + c];
  const int64_t g = c * epw / q.group_size;
  const float s = load_sb(q.scales, q.sb_bf16, (row0 + r) * q.sb_stride + g);
  const float b = load_sb(q.biases, q.sb_bf16, (row0 + r) * q.sb_stride + g);
  TO* o = out + r * q.cols + c * epw;
  for (int j = 0; j < epw; ++j) o[j] = from_f<TO>(s * static_cast<float>((word >> (q.bits * j)) & mask) + b);
}

template <class TO>
__global__ void embed_q_kernel(const QuantView q, const int32_t* __restrict__ ids, TO* __restrict__ out) {
  const int64_t row = ids[blockIdx.x];
  const int64_t W = q.cols * q.bits / 32;
  const int epw = 32 / q.bits;
  const uint32_t mask = (1u << q.bits) - 1u;
  TO* o = out + blockIdx.x * q.cols;
  for (int64_t c = threadIdx.x; c < W; c += blockDim.x) {
    const uint32_t word = q.w[row * q.w_stride + c];
    const int64_t g = c * epw / q.group_size;
    const float s = load_sb(q.scales, q.sb_bf16, row * q.sb_stride + g);
    const float b = load_sb(q.biases, q.sb_bf16, row * q.sb_stride + g);
    for (int j = 0; j < epw; ++j)
      o[c * epw + j] = from_f<TO>(s * static_cast<float>((word >> (q.bits * j)) & mask) + b);
  }
}

template <class TI, class TO>
__global__ void embed_dense_kernel(const TI* __restrict__ table, int64_t dim, const int32_t* __restrict__ ids,
                                   TO* __restrict__ out) {
  const TI* src = table + static_cast<int64_t>(ids[blockIdx.x]) * dim;
  TO* o = out + blockIdx.x * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) o[i] = from_f<TO>(to_f(src[i]));
}

void check_geometry(const QuantView& q) {
  if (q.bits != 4 && q.bits != 8)
    throw Error(ErrorKind::Unsupported,
                "CUDA backend: " + std::to_string(q.bits) + "-bit weights (4 and 8 are supported)");
  if (q.group_size < 32 || (q.group_size & (q.group_size - 1)) || q.cols % q.group_size != 0 || q.w_stride % 4 != 0 ||
      q.rows >= (int64_t{1} << 31))
    throw Error(ErrorKind::Unsupported, "CUDA backend: quantized matrix geometry not supported");
}

}  // namespace

void gemv_quantized(const QuantView& q, const void* x, DType xt, void* y, DType yt, const float* bias) {
  check_geometry(q);
  if (gemv_q_mma(q, x, xt, y, yt, bias)) {  // bf16 activations: tensor cores (gemv_mma.cu)
    check_launch("gemv_quantized");
    return;
  }
  const unsigned blocks = static_cast<unsigned>((q.rows + kRows * kWarps - 1) / (kRows * kWarps));
  const int shift = __builtin_ctz(static_cast<unsigned>(q.group_size));
  LATHE_DISPATCH_ACT(xt, "gemv", TX, {
    LATHE_DISPATCH_ACT(yt, "gemv", TY, {
      if (q.bits == 4)
        gemv_kernel<4, TX, TY>
            <<<blocks, kWarps * 32, 0, stream()>>>(q, shift, static_cast<const TX*>(x), static_cast<TY*>(y), bias);
      else
        gemv_kernel<8, TX, TY>
            <<<blocks, kWarps * 32, 0, stream()>>>(q, shift, static_cast<const TX*>(x), static_cast<TY*>(y), bias);
    });
  });
  check_launch("gemv_quantized");
}

bool gemv_quantized_rows(const QuantView& q, const void* x, DType xt, int64_t tokens, void* y, DType yt,
                         const float* bias) {
  check_geometry(q);
  if (!gemv_q_mma(q, x, xt, y, yt, bias, tokens)) return false;
  check_launch("gemv_quantized_rows");
  return true;
}

void dequantize(const QuantView& q, int64_t row0, int64_t n, void* out, DType ot) {
  check_geometry(q);
  const int64_t words = n * (q.cols * q.bits / 32);
  if (words == 0) return;
  LATHE_DISPATCH_ACT(ot, "dequantize", TO,
                     dequant_kernel<TO>
                     <<<blocks_for(words, 256), 256, 0, stream()>>>(q, row0, n, static_cast<TO*>(out)));
  check_launch("dequantize");
}

void embedding_quantized(const QuantView& q, const int32_t* ids, int64_t n, void* out, DType ot) {
  check_geometry(q);
  if (n == 0) return;
  LATHE_DISPATCH_ACT(ot, "embedding", TO,
                     embed_q_kernel<TO><<<static_cast<unsigned>(n), 128, 0, stream()>>>(q, ids, static_cast<TO*>(out)));
  check_launch("embedding_quantized");
}

void embedding_dense(const void* table, DType tt, int64_t dim, const int32_t* ids, int64_t n, void* out, DType ot) {
  if (n == 0) return;
  LATHE_DISPATCH_ACT(tt, "embedding", TI, {
    LATHE_DISPATCH_ACT(ot, "embedding", TO,
                       embed_dense_kernel<TI, TO><<<static_cast<unsigned>(n), 256, 0, stream()>>>(
                           static_cast<const TI*>(table), dim, ids, static_cast<TO*>(out)));
  });
  check_launch("embedding_dense");
}

}  // namespace lathe::cuda
