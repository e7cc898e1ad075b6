// Allowed-token masks on the device (the device sampler's grammar rows): one thread per logit of each masked row,
// a token whose bit is clear becomes -inf, as the host's ConstraintState::mask would leave it.
#include <cmath>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/kernels.h"

namespace lathe::cuda {
namespace {

__global__ void token_masks_kernel(float* __restrict__ x, int64_t cols, const int32_t* __restrict__ rows,
                                   const uint64_t* __restrict__ bits, int64_t words) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const uint64_t word = bits[blockIdx.y * words + (c >> 6)];
  if (!((word >> (c & 63)) & 1)) x[static_cast<int64_t>(rows[blockIdx.y]) * cols + c] = -INFINITY;
}

}  // namespace

void apply_token_masks(float* x, int64_t cols, const int32_t* rows, int64_t n, const uint64_t* bits) {
  if (n <= 0 || cols <= 0) return;
  constexpr int kThreads = 256;
  const int64_t words = (cols + 63) / 64;
  token_masks_kernel<<<dim3(static_cast<unsigned>((cols + kThreads - 1) / kThreads), static_cast<unsigned>(n)),
                       kThreads, 0, stream()>>>(x, cols, rows, bits, words);
  check_launch("token_masks");
}

}  // namespace lathe::cuda
