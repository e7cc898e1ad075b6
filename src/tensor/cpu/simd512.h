// AVX-512 helpers shared by the kernels chosen at run time on AVX-512 machines (the binary's baseline stays AVX2;
// functions carry LATHE_A512 as their target).
#pragma once
#if defined(__x86_64__)
#include <immintrin.h>

#include <cstring>

#define LATHE_A512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")))

namespace lathe::cpu {

// The sum of 16 lanes in one fixed order (halves, then quarters, then pairs). Written out because GCC 12's
// _mm512_reduce_add_ps trips -Wmaybe-uninitialized: its plain forms pass a self-initialized "undefined" vector
// that the warning reports once inlined; the full-mask zeroing forms are the same instructions.
LATHE_A512 inline float reduce16(__m512 v) {
  const __m256 hi = _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xF, _mm512_castps_pd(v), 1));
  __m256 lo;
  std::memcpy(&lo, &v, sizeof lo);  // the lower half; no instruction (the cast intrinsic warns like the rest)
  const __m256 s8 = _mm256_add_ps(lo, hi);
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
  return _mm_cvtss_f32(s4);
}

}  // namespace lathe::cpu
#endif
