// MLX affine quantization of K/V groups on the device, shared by the quantize kernels (kv_quant.cu) and the fused
// decode append (fused.cu): quant::quantize_rows' arithmetic, so every path stores the CPU's codes.
#pragma once

namespace lathe::cuda {

// A group's scale and bias from its min and max: the extreme of larger magnitude becomes code 0 or n_bins exactly.
__device__ __forceinline__ void affine_scale_bias(float mn, float mx, float n_bins, float& scale, float& bias) {
  const bool neg_edge = fabsf(mn) > fabsf(mx);
  scale = fmaxf((mx - mn) / n_bins, 1e-7f);
  scale = neg_edge ? scale : -scale;
  const float edge = neg_edge ? mn : mx;
  const float q0 = rintf(edge / scale);
  bias = 0.0f;
  if (q0 != 0.0f) {
    scale = edge / q0;
    bias = edge;
  }
}

// A value's code against the stored (rounded) scale s and bias b.
__device__ __forceinline__ uint32_t affine_code(float x, float s, float b, float n_bins) {
  return static_cast<uint32_t>(fminf(fmaxf(rintf((x - b) / s), 0.0f), n_bins));
}

}  // namespace lathe::cuda
