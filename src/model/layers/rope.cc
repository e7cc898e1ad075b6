#include "model/layers/rope.h"

#include <cmath>

#include "common/error.h"

namespace lathe {

RopeTable make_rope(const RopeParams& p, int64_t head_dim) {
  RopeTable r;
  const float theta = static_cast<float>(p.theta);
  if (p.type == "proportional") {
    // Gemma 4 global layers: rotate floor(head_dim * prf) dims, frequencies over the full head_dim, the rest
    // of the pairs left unrotated (inverse frequency 0).
    r.dims = static_cast<int>(head_dim);
    const int64_t rotated = static_cast<int64_t>(std::floor(static_cast<double>(head_dim) * p.partial_rotary_factor));
    r.inv_freq.assign(static_cast<size_t>(head_dim / 2), 0.0f);
    for (int64_t i = 0; i < rotated / 2; ++i) {
      const float e = static_cast<float>(2 * i) / static_cast<float>(head_dim);
      r.inv_freq[static_cast<size_t>(i)] = 1.0f / (static_cast<float>(p.factor) * std::pow(theta, e));
    }
    return r;
  }
  r.dims = static_cast<int>(static_cast<double>(head_dim) * p.partial_rotary_factor);
  r.dims -= r.dims % 2;
  const int64_t half = r.dims / 2;
  r.inv_freq.resize(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {  // f32 as the reference computes it: 1 / theta^(2i/dims)
    const float e = static_cast<float>(2 * i) / static_cast<float>(r.dims);
    r.inv_freq[static_cast<size_t>(i)] = 1.0f / std::pow(theta, e);
  }
  if (p.type == "default") return r;
  if (p.type == "linear") {
    for (float& f : r.inv_freq) f /= static_cast<float>(p.factor);
    return r;
  }
  if (p.type == "llama3") {
    const float factor = static_cast<float>(p.factor), lo = static_cast<float>(p.low_freq_factor),
                hi = static_cast<float>(p.high_freq_factor);
    const float old_ctx = static_cast<float>(p.original_max_position_embeddings);
    if (old_ctx <= 0) throw Error(ErrorKind::Corrupt, "llama3 rope scaling needs original_max_position_embeddings");
    const float low_wavelen = old_ctx / lo, high_wavelen = old_ctx / hi;
    for (float& f : r.inv_freq) {
      const float wavelen = 2.0f * static_cast<float>(M_PI) / f;
      float g = wavelen > low_wavelen ? f / factor : f;
      if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
        const float smooth = (old_ctx / wavelen - lo) / (hi - lo);
        g = (1.0f - smooth) * g / factor + smooth * g;
      }
      f = g;
    }
    return r;
  }
  throw Error(ErrorKind::Unsupported,
              "rope type '" + p.type + "' is not supported (default, linear, llama3, proportional)");
}

}  // namespace lathe
