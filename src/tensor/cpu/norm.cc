// RMSNorm in f32: x · rsqrt(mean(x²) + eps) · w (or · (1 + w) for Gemma, or unweighted).
#include <cmath>
#include <vector>

#include "tensor/cpu/kernels.h"
#include "tensor/cpu/simd.h"
#include "tensor/thread_pool.h"

namespace lathe::cpu {

void rms_norm(const Tensor& x, const Tensor& w, float eps, bool plus_one, Tensor& out) {
  const int64_t D = x.dim(-1), rows = x.numel() / D;
  std::vector<float> weight;
  if (w.defined()) {
    weight = w.to_floats();
    if (plus_one)
      for (float& v : weight) v += 1.0f;
  }
  const float* xp = x.data<float>();
  float* op = out.data<float>();
  parallel_for(rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = xp + r * D;
      float* orow = op + r * D;
      const float ss = dot_f32(xr, xr, D);
      const float inv = 1.0f / std::sqrt(ss / static_cast<float>(D) + eps);
      if (weight.empty())
        for (int64_t i = 0; i < D; ++i) orow[i] = xr[i] * inv;
      else
        for (int64_t i = 0; i < D; ++i) orow[i] = weight[static_cast<size_t>(i)] * (xr[i] * inv);
    }
  });
}

}  // namespace lathe::cpu

namespace lathe::cpu {

void rms_norm_gated(const Tensor& x, const Tensor& z, const Tensor& w, float eps, Tensor& out) {
  const int64_t D = x.dim(-1), rows = x.numel() / D;
  const std::vector<float> weight = w.to_floats();
  const float* xp = x.data<float>();
  const float* zp = z.data<float>();
  float* op = out.data<float>();
  parallel_for(rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = xp + r * D;
      const float* zr = zp + r * D;
      const float inv = 1.0f / std::sqrt(dot_f32(xr, xr, D) / static_cast<float>(D) + eps);
      for (int64_t i = 0; i < D; ++i) {
        const float gate = zr[i] / (1.0f + std::exp(-zr[i]));
        op[r * D + i] = weight[static_cast<size_t>(i)] * (xr[i] * inv) * gate;
      }
    }
  });
}

void l2_normalize(const Tensor& x, float eps, Tensor& out) {
  const int64_t D = x.dim(-1), rows = x.numel() / D;
  const float* xp = x.data<float>();
  float* op = out.data<float>();
  parallel_for(rows, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = xp + r * D;
      const float inv = 1.0f / std::sqrt(dot_f32(xr, xr, D) + eps);
      for (int64_t i = 0; i < D; ++i) op[r * D + i] = xr[i] * inv;
    }
  });
}

}  // namespace lathe::cpu
