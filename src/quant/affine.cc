#include "quant/affine.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace lathe::quant {

bool supported_bits(int bits) { return bits == 2 || bits == 4 || bits == 8; }
bool supported_group_size(int g) { return g == 32 || g == 64 || g == 128; }

namespace {
void store_scalar(Tensor& t, int64_t i, float v) {
  switch (t.dtype()) {
    case DType::BF16: t.data<uint16_t>()[i] = f32_to_bf16(v); break;
    case DType::F16: t.data<uint16_t>()[i] = f32_to_f16(v); break;
    default: t.data<float>()[i] = v; break;
  }
}
float load_scalar(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::BF16: return bf16_to_f32(t.data<uint16_t>()[i]);
    case DType::F16: return f16_to_f32(t.data<uint16_t>()[i]);
    default: return t.data<float>()[i];
  }
}
}  // namespace

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
  const int epw = 32 / bits;
  const int64_t words = cols / epw, groups = cols / group_size;
  const float n_bins = static_cast<float>((1 << bits) - 1);
  QuantizedMatrix q;
  q.bits = bits;
  q.group_size = group_size;
  q.w = Tensor::zeros({rows, words}, DType::U32);
  q.scales = Tensor::empty({rows, groups}, scale_dtype);
  q.biases = Tensor::empty({rows, groups}, scale_dtype);
  uint32_t* wp = q.w.data<uint32_t>();
  for (int64_t r = 0; r < rows; ++r) {
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
      store_scalar(q.scales, r * groups + g, scale);
      store_scalar(q.biases, r * groups + g, bias);
      // Codes are computed against the stored (rounded) scale and bias so dequantization is consistent.
      const float s = load_scalar(q.scales, r * groups + g), b = load_scalar(q.biases, r * groups + g);
      for (int k = 0; k < group_size; ++k) {
        const float code = std::clamp(std::nearbyint((x[k] - b) / s), 0.0f, n_bins);
        const int64_t e = g * group_size + k;
        wp[r * words + e / epw] |= static_cast<uint32_t>(code) << (bits * (e % epw));
      }
    }
  }
  return q;
}

}  // namespace lathe::quant
