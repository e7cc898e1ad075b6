// MLX affine quantization: groups of `group_size` values along a row share a scale and a bias; each value is
// a `bits`-bit code q with value = scale·q + bias, packed little-endian into uint32 words (element j of a word
// at bit offset bits·j). Shared by the loader's checks, the quantize job, KV quantization and tests.
#pragma once
#include <cstdint>

#include "tensor/ops.h"

namespace lathe::quant {

bool supported_bits(int bits);         // 2, 4, 8
bool supported_group_size(int group);  // 32, 64, 128

// Quantizes a [rows, cols] f32 matrix (cols a multiple of group_size) as MLX does: per group the extreme of
// larger magnitude is represented exactly. Scales and biases are stored as `scale_dtype` (BF16, F16 or F32).
QuantizedMatrix quantize(const float* w, int64_t rows, int64_t cols, int bits, int group_size,
                         DType scale_dtype = DType::BF16);
// The same for KV cache rows, where the group may be any size whose codes fill whole words: a head narrower
// than the configured KV group size is quantized as one group (e.g. 16-wide heads with group 32 or 64).
QuantizedMatrix quantize_kv_rows(const float* x, int64_t rows, int64_t cols, int bits, int group_size,
                                 DType scale_dtype);

}  // namespace lathe::quant
