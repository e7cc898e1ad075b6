// What a template's generator hands back: its rows in generation order, and how many inputs it skipped.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "jobs/job_types.h"

namespace lathe::dataset {

struct Generated {
  std::vector<jobs::json> rows;
  int64_t skipped = 0;
};

// Reports rows made so far out of the expected total (generators that know it up front call it as they go).
using Progress = std::function<void(int64_t done, int64_t total)>;

// The most rows one job makes, whatever its input.
constexpr int64_t kMaxDatasetRows = 1'000'000;

}  // namespace lathe::dataset
