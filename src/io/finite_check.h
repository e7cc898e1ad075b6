// Finding NaN and infinity in weights read from files: one such value makes every output NaN (or, through a
// sampler, empty), so loaders refuse the tensor by name instead (model weights, LoRA adapters).
#pragma once
#include <cstdint>

#include "tensor/tensor.h"

namespace lathe {

// The index of the first NaN or infinity in a contiguous host tensor of a float dtype (its exponent bits all
// ones), or -1: also for other dtypes and for tensors that are not contiguous host memory.
int64_t first_non_finite(const Tensor& t);

}  // namespace lathe
