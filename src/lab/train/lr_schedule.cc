#include "lab/train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace lathe::train {

double LrSchedule::at(int64_t step) const {
  if (kind == "constant" && warmup <= 0) return peak;
  const int64_t w = std::max<int64_t>(warmup, 1);
  if (warmup > 0 && step <= w) return peak * static_cast<double>(step) / static_cast<double>(w);
  if (kind == "constant") return peak;
  const int64_t start = warmup > 0 ? w : 0;
  const int64_t span = std::max<int64_t>(iters - start, 1);
  const double t = std::clamp(static_cast<double>(step - start) / static_cast<double>(span), 0.0, 1.0);
  const double lo = final_fraction * peak;
  return lo + 0.5 * (peak - lo) * (1.0 + std::cos(M_PI * t));
}

}  // namespace lathe::train
