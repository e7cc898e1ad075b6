// One adapter set's LoRA factors at one linear site, as the gathered device kernels read them: a slot keeps an
// array of these indexed by site (lora/device_slot.h), and a forward names, per token, whose array applies. A
// stacked set ("a+b") is one factor of the summed rank: A rows and B columns concatenated, each rank's own scale.
#pragma once
#include <cstdint>

namespace lathe {

struct LoraSiteDesc {
  const void* a = nullptr;       // [rank, in], the activation type
  const void* b = nullptr;       // [out, rank], the activation type
  const float* scale = nullptr;  // [rank]: the factor's scale, per rank so that stacked factors keep their own
  int32_t rank = 0;              // 0: no factor at this site
  int32_t pad = 0;
};

// Up to three sites sharing one input (q|k|v, gate|up), their outputs side by side in one row: site i writes
// columns [col0[i], col0[i] + cols[i]) of y.
struct LoraGroup {
  int n = 0;
  int site[3] = {-1, -1, -1};
  int64_t col0[3] = {0, 0, 0};
  int64_t cols[3] = {0, 0, 0};
};

}  // namespace lathe
