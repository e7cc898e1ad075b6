// Logits-processor edits of a whole step on the device (the device sampler's logit_bias and penalties): one
// thread per touched token, the same float operations as the host sampler (tensor/logit_edit.h).
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/kernels.h"

namespace lathe::cuda {
namespace {

__global__ void logit_edits_kernel(float* __restrict__ x, const LogitEdit* __restrict__ edits, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const LogitEdit e = edits[i];
  x[e.index] = apply_logit_edit(x[e.index], e);
}

}  // namespace

void apply_logit_edits(float* x, const LogitEdit* edits, int64_t n) {
  if (n <= 0) return;
  constexpr int kThreads = 256;
  logit_edits_kernel<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, stream()>>>(x, edits, n);
  check_launch("logit_edits");
}

}  // namespace lathe::cuda
