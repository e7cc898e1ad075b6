// Without the CUDA backend there are no device copies of weights to keep.
#ifndef LATHE_HAVE_CUDA
#include "tensor/dense_weights.h"

namespace lathe {
void set_dense_weight_budget(int64_t) {}
DenseWeightStats dense_weight_stats() { return {}; }
void release_dense_weights() {}
int64_t dense_weights_generation() { return 0; }
int64_t device_free_bytes() { return 0; }
}  // namespace lathe
#endif
