// Small SIMD helpers shared by the CPU kernels (AVX2 when compiled for x86-64-v3, scalar otherwise).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define LATHE_AVX2 1
#endif

namespace lathe::cpu {

// e^x = 2^n · e^r with n = round(x · log2 e) and r = x − n · ln2 (ln2 in two parts, so n · kLn2Hi is exact for
// the n a float exp can have), e^r by its degree-6 Taylor polynomial (|r| ≤ ln2 / 2): within a few ulp. The
// vector exps of the kernels (AVX2 silu, AVX-512 softmax) all evaluate exactly this.
namespace exp_poly {
constexpr float kLog2e = 1.44269504f, kLn2Hi = 0.693145752f, kLn2Lo = 1.42860677e-6f;
constexpr int kTerms = 7;
constexpr float kCoef[kTerms] = {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};  // highest first
}  // namespace exp_poly

#ifdef LATHE_AVX2
inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}
// e^x, 8 lanes, by exp_poly; x is clamped to [−87, 88], so e^x stays a normal float (−inf gives e^−87, not 0:
// callers that mask keys with −inf zero those lanes themselves). ~10× cheaper than libm's expf per element.
inline __m256 exp_poly8(__m256 x) {
  using namespace exp_poly;
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
  const __m256 n =
      _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kCoef[0]);
  for (int i = 1; i < kTerms; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kCoef[i]));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}
// Softmax numerators of attention: turns scores[j0, j1) into e^(s_j − mx) in place, 8 at a time (exp_poly8, the
// AVX-512 kernels' exp; a masked key's −inf weighs exactly 0), and returns their sum: lane sums, then hsum, in one
// fixed order.
inline float softmax_weights8(float* scores, int64_t j0, int64_t j1, float mx) {
  const __m256 vmx = _mm256_set1_ps(mx), neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  const auto weights = [&](__m256 s) {
    return _mm256_andnot_ps(_mm256_cmp_ps(s, neg_inf, _CMP_EQ_OQ), exp_poly8(_mm256_sub_ps(s, vmx)));
  };
  __m256 vsum = _mm256_setzero_ps();
  int64_t j = j0;
  for (; j + 8 <= j1; j += 8) {
    const __m256 e = weights(_mm256_loadu_ps(scores + j));
    _mm256_storeu_ps(scores + j, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  if (j < j1) {  // the tail padded with masked keys, which add 0
    alignas(32) float t[8];
    std::fill(t, t + 8, -std::numeric_limits<float>::infinity());
    std::copy(scores + j, scores + j1, t);
    const __m256 e = weights(_mm256_load_ps(t));
    _mm256_store_ps(t, e);
    std::copy(t, t + (j1 - j), scores + j);
    vsum = _mm256_add_ps(vsum, e);
  }
  return hsum(vsum);
}

// 8 bf16 values -> 8 f32.
inline __m256 load_bf16x8(const uint16_t* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
#endif

inline float dot_f32(const float* a, const float* b, int64_t n) {
  int64_t i = 0;
  float s = 0.f;
#ifdef LATHE_AVX2
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), a1);
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), a0);
  s = hsum(_mm256_add_ps(a0, a1));
#endif
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// y += a * x
inline void axpy_f32(float a, const float* x, float* y, int64_t n) {
  int64_t i = 0;
#ifdef LATHE_AVX2
  __m256 va = _mm256_set1_ps(a);
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
#endif
  for (; i < n; ++i) y[i] += a * x[i];
}

}  // namespace lathe::cpu
