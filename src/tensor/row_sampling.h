// One row's draw for the device sampler's kernel (tensor/cuda/sample_rows.cu): the host Sampler's settings for
// that row and step, already in the form the host computes them (engine/device_sampler.cc fills it), so that the
// kernel repeats the host's float operations rather than recomputing them its own way.
#pragma once
#include <cstdint>

namespace lathe {

struct RowSampling {
  double u = 0;               // the step's categorical draw in [0, 1) (Sampler's (seed, step) stream)
  float inv_temperature = 0;  // 1.0f / temperature as the host divides; 0 = greedy (argmax, no filters)
  float top_p = 1;            // filters on log-probabilities, in the host's order: top-p, min-p, top-k
  float log_min_p = 0;        // std::log(min_p) as the host's float log gives it; used when min_p > 0
  float min_p = 0;
  int32_t top_k = 0;
  int32_t unused = 0;
};

}  // namespace lathe
