// Gated activations for MLPs.
#include <algorithm>
#include <cmath>

#include "tensor/cpu/kernels.h"
#include "tensor/cpu/simd.h"
#include "tensor/thread_pool.h"

namespace lathe::cpu {
namespace {
namespace gated_act {  // (a namespace of its own: unity builds merge the anonymous namespaces of several files)

#ifdef LATHE_AVX2
inline __m256 silu_mul8(__m256 g, __m256 u) {
  return _mm256_mul_ps(
      _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), exp_poly8(_mm256_sub_ps(_mm256_setzero_ps(), g)))), u);
}
#endif

// o[i] = g[i] / (1 + e^−g[i]) · u[i] over [b, e). With fast_exp every element, the tail's too, goes through the same
// 8-lane arithmetic (the tail padded), so an element's value never depends on where a range starts or ends.
void silu_mul_range(const float* g, const float* u, float* o, int64_t b, int64_t e, bool fast_exp) {
#ifdef LATHE_AVX2
  if (fast_exp) {
    int64_t i = b;
    for (; i + 8 <= e; i += 8) _mm256_storeu_ps(o + i, silu_mul8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
    if (i < e) {
      alignas(32) float gt[8] = {}, ut[8] = {}, ot[8];
      std::copy(g + i, g + e, gt);
      std::copy(u + i, u + e, ut);
      _mm256_store_ps(ot, silu_mul8(_mm256_load_ps(gt), _mm256_load_ps(ut)));
      std::copy(ot, ot + (e - i), o + i);
    }
    return;
  }
#else
  (void)fast_exp;
#endif
  for (int64_t i = b; i < e; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

}  // namespace gated_act
}  // namespace

void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out, bool fast_exp) {
  const float* g = gate.data<float>();
  const float* u = up.data<float>();
  float* o = out.data<float>();
  parallel_for(gate.numel(), 4096, [&](int64_t b, int64_t e) { gated_act::silu_mul_range(g, u, o, b, e, fast_exp); });
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
