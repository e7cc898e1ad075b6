#include "tensor/cpu/row_scan.h"

#include <algorithm>
#include <cmath>
#include <limits>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace lathe::cpu {

RowMax row_max(const float* p, size_t n) {
  size_t i = 0;
  float m = -std::numeric_limits<float>::infinity();
  bool nan = false;
#if defined(__AVX2__)
  __m256 m0 = _mm256_set1_ps(m), m1 = m0, unordered = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    const __m256 a = _mm256_loadu_ps(p + i), b = _mm256_loadu_ps(p + i + 8);
    unordered =
        _mm256_or_ps(unordered, _mm256_or_ps(_mm256_cmp_ps(a, a, _CMP_UNORD_Q), _mm256_cmp_ps(b, b, _CMP_UNORD_Q)));
    m0 = _mm256_max_ps(m0, a);  // (a NaN lane may stick here: it is reported, and the max is then not used)
    m1 = _mm256_max_ps(m1, b);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_max_ps(m0, m1));
  for (const float v : lanes) m = std::max(m, v);
  nan = _mm256_movemask_ps(unordered) != 0;
#endif
  for (; i < n; ++i) {
    nan = nan || std::isnan(p[i]);
    if (p[i] > m) m = p[i];
  }
  return {m, nan};
}

size_t first_at_least(const float* p, size_t n, float threshold) {
  size_t i = 0;
#if defined(__AVX2__)
  const __m256 t = _mm256_set1_ps(threshold);
  for (; i + 16 <= n; i += 16) {  // whole blocks with nothing that large are skipped
    const __m256 a = _mm256_cmp_ps(_mm256_loadu_ps(p + i), t, _CMP_GE_OQ);
    const __m256 b = _mm256_cmp_ps(_mm256_loadu_ps(p + i + 8), t, _CMP_GE_OQ);
    if (_mm256_movemask_ps(_mm256_or_ps(a, b)) != 0) break;
  }
#endif
  for (; i < n; ++i)
    if (p[i] >= threshold) return i;
  return n;
}

}  // namespace lathe::cpu
