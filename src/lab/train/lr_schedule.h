// Learning rate per step (1-based): constant, or linear warmup over max(warmup, 1) steps then cosine from the
// peak down to 0.1 x peak over the remaining (iters - warmup) steps.
#pragma once
#include <cstdint>
#include <string>

namespace lathe::train {

struct LrSchedule {
  std::string kind = "constant";  // "constant" | "cosine"
  double peak = 2e-4;
  int64_t warmup = 0;
  int64_t iters = 100;
  double final_fraction = 0.1;
  double at(int64_t step) const;
};

}  // namespace lathe::train
