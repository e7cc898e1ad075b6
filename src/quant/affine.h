// MLX affine quantization: groups of `group_size` values along a row share a scale and a bias; each value is
// a `bits`-bit code q with value = scale·q + bias, packed as one little-endian bit stream per row (element e
// at bit offset bits·e, stored as uint32 words: for 2/4/8 bits element j of a word sits at bits·j; 3, 5 and
// 6-bit codes straddle words as MLX's 3- and 5-byte packs do). Shared by the loader's checks, the quantize
// job, KV quantization and tests.
#pragma once
#include <cstdint>

#include "tensor/ops.h"

namespace lathe::quant {

bool supported_bits(int bits);         // 2, 3, 4, 5, 6, 8
bool supported_group_size(int group);  // 32, 64, 128

// Quantizes a [rows, cols] f32 matrix (cols a multiple of group_size) as MLX does: per group the extreme of
// larger magnitude is represented exactly. Scales and biases are stored as `scale_dtype` (BF16, F16 or F32).
QuantizedMatrix quantize(const float* w, int64_t rows, int64_t cols, int bits, int group_size,
                         DType scale_dtype = DType::BF16);
// The same for KV cache rows, where the group may be any size whose codes fill whole words: a head narrower
// than the configured KV group size is quantized as one group (e.g. 16-wide heads with group 32 or 64).
QuantizedMatrix quantize_kv_rows(const float* x, int64_t rows, int64_t cols, int bits, int group_size,
                                 DType scale_dtype);

// The core of quantize() on raw rows: w [rows, cols] f32 into packed words [rows, cols·bits/32] and scales
// and biases [rows, cols/group_size] of `scale_dtype` (2-byte types as uint16, F32 as float).
void quantize_rows(const float* w, int64_t rows, int64_t cols, int bits, int group_size, DType scale_dtype,
                   uint32_t* packed, void* scales, void* biases);
// Code e of a packed row.
inline uint32_t code_at(const uint32_t* row, int bits, int64_t e) {
  const int64_t bit = e * bits;
  const int64_t word = bit / 32;
  const int off = static_cast<int>(bit % 32);
  uint64_t v = row[word] >> off;
  if (off + bits > 32) v |= static_cast<uint64_t>(row[word + 1]) << (32 - off);
  return static_cast<uint32_t>(v) & ((1u << bits) - 1u);
}
// Dequantizes one packed row to f32 (scales/biases of that row given as f32).
void dequantize_row(const uint32_t* row, int64_t cols, int bits, int group_size, const float* scales,
                    const float* biases, float* out);

}  // namespace lathe::quant
