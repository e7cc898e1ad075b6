// Rotary embedding, rotate-half convention: pairs (i, i + dims/2) of the first `dims` features of each head.
#include <cmath>
#include <vector>

#include "tensor/cpu/kernels.h"
#include "tensor/thread_pool.h"

namespace lathe::cpu {

void rope_inplace(Tensor& x, const RopeTable& rope, int64_t pos0) {
  const int64_t T = x.dim(0), H = x.dim(1), D = x.dim(2);
  const int64_t half = rope.dims / 2;
  float* xp = x.data<float>();
  parallel_for(T, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
    for (int64_t t = t0; t < t1; ++t) {
      const float pos = static_cast<float>(pos0 + t);
      for (int64_t i = 0; i < half; ++i) {
        const float angle = pos * rope.inv_freq[static_cast<size_t>(i)];  // f32 product, as the reference
        c[static_cast<size_t>(i)] = std::cos(angle) * rope.attention_scaling;
        s[static_cast<size_t>(i)] = std::sin(angle) * rope.attention_scaling;
      }
      for (int64_t h = 0; h < H; ++h) {
        float* v = xp + (t * H + h) * D;
        for (int64_t i = 0; i < half; ++i) {
          const float a = v[i], b = v[i + half];
          v[i] = a * c[static_cast<size_t>(i)] - b * s[static_cast<size_t>(i)];
          v[i + half] = b * c[static_cast<size_t>(i)] + a * s[static_cast<size_t>(i)];
        }
      }
    }
  });
}

}  // namespace lathe::cpu
