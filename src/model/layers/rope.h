// RoPE frequency tables from config rope parameters: default, linear, llama3, proportional; partial rotary
// dims via partial_rotary_factor.
#pragma once
#include "model/config.h"
#include "tensor/ops.h"

namespace lathe {

// Throws Error(Unsupported) naming the rope type when it is not one lathe implements.
RopeTable make_rope(const RopeParams& params, int64_t head_dim);

}  // namespace lathe
