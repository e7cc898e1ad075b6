// Gated activations for MLPs.
#include <cmath>

#include "tensor/cpu/kernels.h"
#include "tensor/thread_pool.h"

namespace lathe::cpu {

void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) {
  const float* g = gate.data<float>();
  const float* u = up.data<float>();
  float* o = out.data<float>();
  parallel_for(gate.numel(), 4096, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  });
}

void gelu_tanh_mul(const Tensor& gate, const Tensor& up, Tensor& out) {
  const float* g = gate.data<float>();
  const float* u = up.data<float>();
  float* o = out.data<float>();
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  parallel_for(gate.numel(), 4096, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float x = g[i];
      o[i] = 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x))) * u[i];
    }
  });
}

}  // namespace lathe::cpu

namespace lathe::cpu {

void sigmoid_mul(const Tensor& x, const Tensor& gate, Tensor& out) {
  const float* a = x.data<float>();
  const float* g = gate.data<float>();
  float* o = out.data<float>();
  parallel_for(x.numel(), 4096, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) o[i] = a[i] / (1.0f + std::exp(-g[i]));
  });
}

}  // namespace lathe::cpu
