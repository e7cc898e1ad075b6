#include "quant/affine.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace lathe::quant {

bool supported_bits(int bits) { return bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8; }
bool supported_group_size(int g) { return g == 32 || g == 64 || g == 128; }

QuantizedMatrix quantize(const float* w, int64_t rows, int64_t cols, int bits, int group_size, DType scale_dtype) {
  if (!supported_bits(bits) || !supported_group_size(group_size))
    throw Error(ErrorKind::Unsupported, "quantize: " + std::to_string(bits) + "-bit, group " +
                                            std::to_string(group_size) + " is not supported");
  return quantize_kv_rows(w, rows, cols, bits, group_size, scale_dtype);
}

QuantizedMatrix quantize_kv_rows(const float* w, int64_t rows, int64_t cols, int bits, int group_size,
                                 DType scale_dtype) {
  if (!supported_bits(bits) || group_size <= 0 || (group_size * bits) % 32 != 0)
    throw Error(ErrorKind::Unsupported, "quantize: " + std::to_string(bits) + "-bit, group " +
                                            std::to_string(group_size) + " is not supported");
  if (cols % group_size != 0)
    throw Error(ErrorKind::InvalidArgument,
                "quantize: " + std::to_string(cols) + " columns is not a multiple of the group size");
  QuantizedMatrix q;
  q.bits = bits;
  q.group_size = group_size;
  q.w = Tensor::zeros({rows, cols * bits / 32}, DType::U32);
  q.scales = Tensor::empty({rows, cols / group_size}, scale_dtype);
  q.biases = Tensor::empty({rows, cols / group_size}, scale_dtype);
  quantize_rows(w, rows, cols, bits, group_size, scale_dtype, q.w.data<uint32_t>(), q.scales.raw(), q.biases.raw());
  return q;
}

namespace {
void store_raw(void* base, DType d, int64_t i, float v) {
  switch (d) {
    case DType::BF16: static_cast<uint16_t*>(base)[i] = f32_to_bf16(v); break;
    case DType::F16: static_cast<uint16_t*>(base)[i] = f32_to_f16(v); break;
    default: static_cast<float*>(base)[i] = v; break;
  }
}
float load_raw(const void* base, DType d, int64_t i) {
  switch (d) {
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}
}  // namespace

void quantize_rows(const float* w, int64_t rows, int64_t cols, int bits, int group_size, DType scale_dtype,
                   uint32_t* packed, void* scales, void* biases) {
  const int64_t words = cols * bits / 32, groups = cols / group_size;
  const float n_bins = static_cast<float>((1 << bits) - 1);
  std::fill(packed, packed + rows * words, 0u);
  for (int64_t r = 0; r < rows; ++r) {
    uint32_t* wp = packed + r * words;
    for (int64_t g = 0; g < groups; ++g) {
      const float* x = w + r * cols + g * group_size;
      const auto [mn_it, mx_it] = std::minmax_element(x, x + group_size);
      const float mn = *mn_it, mx = *mx_it;
      // Represent the extreme of larger magnitude exactly: it becomes code 0 or n_bins.
      const bool neg_edge = std::fabs(mn) > std::fabs(mx);
      float scale = std::max((mx - mn) / n_bins, 1e-7f);
      scale = neg_edge ? scale : -scale;
      const float edge = neg_edge ? mn : mx;
      const float q0 = std::nearbyint(edge / scale);
      float bias = 0.0f;
      if (q0 != 0.0f) {
        scale = edge / q0;
        bias = edge;
      }
      const int64_t si = r * groups + g;
      store_raw(scales, scale_dtype, si, scale);
      store_raw(biases, scale_dtype, si, bias);
      // Codes are computed against the stored (rounded) scale and bias so dequantization is consistent.
      const float s = load_raw(scales, scale_dtype, si), b = load_raw(biases, scale_dtype, si);
      for (int k = 0; k < group_size; ++k) {
        const uint32_t code = static_cast<uint32_t>(std::clamp(std::nearbyint((x[k] - b) / s), 0.0f, n_bins));
        const int64_t bit = (g * group_size + k) * bits;
        const int off = static_cast<int>(bit % 32);
        wp[bit / 32] |= code << off;
        if (off + bits > 32) wp[bit / 32 + 1] |= code >> (32 - off);
      }
    }
  }
}

void dequantize_row(const uint32_t* row, int64_t cols, int bits, int group_size, const float* scales,
                    const float* biases, float* out) {
  for (int64_t e = 0; e < cols; ++e)
    out[e] = scales[e / group_size] * static_cast<float>(code_at(row, bits, e)) + biases[e / group_size];
}

}  // namespace lathe::quant
