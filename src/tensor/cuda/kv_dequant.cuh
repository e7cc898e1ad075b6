// Dequantization of K/V codes inside the decode attention kernels (decode_attention.cu, decode_attention_wide.cu):
// each value as dequantize_any (kv_quant.cu) gives it, fmaf(scale, code, bias) rounded to bf16, so attending over
// the codes in place is bitwise attending over a dequantized copy.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace lathe::cuda {

// Two codes' values as dequantize_any gives them (fmaf(scale, code, bias) rounded to bf16), as floats. A code
// arrives as the bits of 2^23 + code (exact as a float, so subtracting 2^23 gives the code as cvt would), and the
// pair rounds to bf16 in one packed conversion: the same values as a cvt, fmaf and __float2bfloat16_rn per code,
// without the two conversions of quarter rate (the wide kernel over 8-bit K/V took 2.4x its bf16 time at 64
// rows, H100).
__device__ __forceinline__ void dequant2(float sc, float bi, uint32_t c0, uint32_t c1, float& f0, float& f1) {
  const float a = fmaf(sc, __uint_as_float(c0) - 8388608.f, bi);
  const float b = fmaf(sc, __uint_as_float(c1) - 8388608.f, bi);
  const __nv_bfloat162 p = __floats2bfloat162_rn(a, b);  // .x (a) in the low half
  const uint32_t u = *reinterpret_cast<const uint32_t*>(&p);
  f0 = __uint_as_float(u << 16);
  f1 = __uint_as_float(u & 0xffff0000u);
}

// Code e of a word as the bits of 2^23 + code.
template <int kBits>
__device__ __forceinline__ uint32_t code_bits(uint32_t w, int e) {
  if constexpr (kBits == 8)
    return __byte_perm(w, 0x4B000000u, 0x7440u | static_cast<unsigned>(e));  // byte e, zeros, then 0x4B
  else
    return ((w >> (4 * e)) & 0xfu) | 0x4B000000u;
}

// 8 consecutive values from their codes (kBits 4: w.x; 8: w.x then w.y), all in one group.
template <int kBits>
__device__ __forceinline__ void dequant8(uint2 w, float sc, float bi, float* f) {
#pragma unroll
  for (int e = 0; e < 8; e += 2) {
    const uint32_t word = kBits == 8 && e >= 4 ? w.y : w.x;
    const int k = kBits == 8 ? e & 3 : e;
    dequant2(sc, bi, code_bits<kBits>(word, k), code_bits<kBits>(word, k + 1), f[e], f[e + 1]);
  }
}

}  // namespace lathe::cuda
