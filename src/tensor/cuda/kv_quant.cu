// Quantized KV caches on the device: MLX affine quantization of new K/V rows (the same arithmetic as
// quant::quantize_kv_rows, so CPU and device caches hold the same codes) and a dequantization that accepts the
// small groups of narrow heads, which the weight kernels (groups ≥ 32) do not.
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/kernels_models.h"
#include "tensor/cuda/kv_quant.cuh"

namespace lathe::cuda {
namespace {

__device__ __forceinline__ float load_s(const void* p, bool bf16, int64_t i) {
  return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]) : static_cast<const float*>(p)[i];
}

// One thread per (row, group).
template <class TX, class TS>
__global__ void quantize_kernel(const TX* __restrict__ x, int64_t rows, int64_t cols, int bits, int gs,
                                uint32_t* __restrict__ w, TS* __restrict__ scales, TS* __restrict__ biases) {
  const int64_t groups = cols / gs;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * groups) return;
  const int64_t r = i / groups, gi = i % groups;
  const TX* xg = x + r * cols + gi * gs;
  float mn = to_f(xg[0]), mx = mn;
  for (int j = 1; j < gs; ++j) {
    mn = fminf(mn, to_f(xg[j]));
    mx = fmaxf(mx, to_f(xg[j]));
  }
  const float n_bins = static_cast<float>((1 << bits) - 1);
  float scale, bias;
  affine_scale_bias(mn, mx, n_bins, scale, bias);
  scales[i] = from_f<TS>(scale);
  biases[i] = from_f<TS>(bias);
  const float s = to_f(scales[i]), b = to_f(biases[i]);  // codes against the stored (rounded) values
  const int epw = 32 / bits;
  uint32_t* wg = w + r * (cols / epw) + gi * gs / epw;
  for (int wi = 0; wi < gs / epw; ++wi) {
    uint32_t word = 0;
    for (int j = 0; j < epw; ++j) {
      word |= affine_code(to_f(xg[wi * epw + j]), s, b, n_bins) << (bits * j);
    }
    wg[wi] = word;
  }
}

// One warp per (row, group) for groups of 32·kPer values: lane l holds values kPer·l .. kPer·l + kPer - 1. The
// arithmetic per group is quantize_kernel's (min and max do not depend on the order they are taken in), so the
// codes, scales and biases are bitwise the same; a thread per group left a 64-row step's K/V quantization at
// ~8 blocks of work (16 us a launch on an H100, 14% of an 8-bit K/V decode step).
template <class TX, class TS, int kPer>
__global__ void quantize_warp_kernel(const TX* __restrict__ x, int64_t rows, int64_t cols, int bits,
                                     uint32_t* __restrict__ w, TS* __restrict__ scales, TS* __restrict__ biases) {
  constexpr int gs = 32 * kPer;
  const int64_t groups = cols / gs;
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  if (i >= rows * groups) return;  // whole warps leave together (blockDim is a multiple of 32)
  const int64_t r = i / groups, gi = i % groups;
  const TX* xg = x + r * cols + gi * gs + kPer * lane;
  float v[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) v[j] = to_f(xg[j]);
  float mn = v[0], mx = v[0];
#pragma unroll
  for (int j = 1; j < kPer; ++j) {
    mn = fminf(mn, v[j]);
    mx = fmaxf(mx, v[j]);
  }
  for (int o = 16; o > 0; o >>= 1) {
    mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, o));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  }
  const float n_bins = static_cast<float>((1 << bits) - 1);
  float scale, bias;
  affine_scale_bias(mn, mx, n_bins, scale, bias);
  const TS s_stored = from_f<TS>(scale), b_stored = from_f<TS>(bias);
  if (lane == 0) {
    scales[i] = s_stored;
    biases[i] = b_stored;
  }
  const float s = to_f(s_stored), b = to_f(b_stored);
  // This lane's codes at their places in its word, then OR-ed across the lanes that share the word.
  const int epw = 32 / bits, lanes_per_word = epw / kPer;
  uint32_t word = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    word |= affine_code(v[j], s, b, n_bins) << (bits * ((kPer * lane + j) % epw));
  }
  for (int o = 1; o < lanes_per_word; o <<= 1) word |= __shfl_xor_sync(0xffffffffu, word, o);
  if (lane % lanes_per_word == 0) w[r * (cols / epw) + (gi * gs + kPer * lane) / epw] = word;
}

template <class TO>
__global__ void dequant_any_kernel(const QuantView q, TO* __restrict__ out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= q.rows * q.cols) return;
  const int64_t r = i / q.cols, c = i % q.cols;
  const int epw = 32 / q.bits;
  const uint32_t word = q.w[r * q.w_stride + c / epw];
  const uint32_t code = (word >> (q.bits * (c % epw))) & ((1u << q.bits) - 1u);
  const int64_t g = r * q.sb_stride + c / q.group_size;
  // One fused multiply-add, as the decode attention's in-register dequantization (decode_attention.cu) does.
  out[i] = from_f<TO>(fmaf(load_s(q.scales, q.sb_bf16, g), static_cast<float>(code), load_s(q.biases, q.sb_bf16, g)));
}

}  // namespace

void quantize_rows(const void* x, DType xt, int64_t rows, int64_t cols, int bits, int gs, uint32_t* w, void* scales,
                   void* biases, DType st) {
  if ((bits != 4 && bits != 8) || gs <= 0 || cols % gs != 0 || (gs * bits) % 32 != 0)
    throw Error(ErrorKind::Unsupported, "quantize_rows: geometry not supported on CUDA");
  const int64_t n = rows * (cols / gs);
  if (n == 0) return;
  if (gs == 32 || gs == 64) {  // a warp per group (the 4- and 8-bit words then never straddle two lanes' values)
    const unsigned blocks = static_cast<unsigned>((n + 3) / 4);
    LATHE_DISPATCH_ACT(xt, "quantize_rows", TX, {
      LATHE_DISPATCH_ACT(st, "quantize_rows", TS, {
        auto* kernel = gs == 32 ? quantize_warp_kernel<TX, TS, 1> : quantize_warp_kernel<TX, TS, 2>;
        kernel<<<blocks, 128, 0, stream()>>>(static_cast<const TX*>(x), rows, cols, bits, w, static_cast<TS*>(scales),
                                             static_cast<TS*>(biases));
      });
    });
    check_launch("quantize_rows");
    return;
  }
  LATHE_DISPATCH_ACT(xt, "quantize_rows", TX, {
    LATHE_DISPATCH_ACT(st, "quantize_rows", TS,
                       quantize_kernel<TX, TS>
                       <<<blocks_for(n, 128), 128, 0, stream()>>>(static_cast<const TX*>(x), rows, cols, bits, gs, w,
                                                                  static_cast<TS*>(scales), static_cast<TS*>(biases)));
  });
  check_launch("quantize_rows");
}

void dequantize_any(const QuantView& q, void* out, DType ot) {
  const int64_t n = q.rows * q.cols;
  if (n == 0) return;
  LATHE_DISPATCH_ACT(ot, "dequantize", TO,
                     dequant_any_kernel<TO><<<blocks_for(n, 256), 256, 0, stream()>>>(q, static_cast<TO*>(out)));
  check_launch("dequantize_any");
}

}  // namespace lathe::cuda
