// Scans over one row of floats (a logits row: 150k+ entries), 16 at a time where the CPU has AVX2. Greedy
// decoding runs them once per token on the thread the pool's others wait for.
#pragma once
#include <cstddef>

namespace lathe::cpu {

struct RowMax {
  float max;  // the largest entry that is not NaN (−inf when there is none)
  bool nan;   // whether any entry is NaN
};
RowMax row_max(const float* p, size_t n);
// The first i with p[i] >= threshold, or n when there is none.
size_t first_at_least(const float* p, size_t n, float threshold);

}  // namespace lathe::cpu
