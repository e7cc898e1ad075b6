// One token's logits-processor edit (logit_bias, repetition / presence / frequency penalties), shared by the host
// sampler and the device kernel so that both change a logit by the same float operations in the same order.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define LATHE_HOST_DEVICE __host__ __device__
#else
#define LATHE_HOST_DEVICE
#endif

namespace lathe {

struct LogitEdit {
  int64_t index = 0;        // flat position in the logits (row · vocab + token)
  float bias = 0.0f;        // logit_bias, added first
  float repetition = 1.0f;  // repetition penalty: a negative logit is multiplied, a positive one divided
  float presence = 0.0f;    // subtracted once
  float frequency = 0.0f;   // subtracted once per occurrence ...
  int32_t occurrences = 0;  // ... this many times (one subtraction each, as the host has always done)
  bool has_bias = false;    // a token without a bias is not touched by the addition (-0 stays -0)
  bool has_repetition = false;
  bool has_presence = false;
};

// mlx-lm's order: logit_bias, repetition penalty, presence penalty, frequency penalty.
LATHE_HOST_DEVICE inline float apply_logit_edit(float v, const LogitEdit& e) {
  if (e.has_bias) v += e.bias;
  if (e.has_repetition) v = v < 0 ? v * e.repetition : v / e.repetition;
  if (e.has_presence) v -= e.presence;
  for (int32_t k = 0; k < e.occurrences; ++k) v -= e.frequency;
  return v;
}

}  // namespace lathe
