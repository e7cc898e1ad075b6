// Block-wide reductions of the training kernels: every thread gets the result, summed (or maxed) over the warps
// in a fixed order, so a row's value never depends on scheduling. The leading barrier lets a block call them back
// to back on the same shared slots.
#pragma once
#include <cmath>

#include "tensor/cuda/common.cuh"

namespace lathe::cuda::train {

__device__ __forceinline__ float train_block_max(float v) {
  __shared__ float part[32];
  __syncthreads();
  v = warp_max(v);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  float t = -INFINITY;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) t = fmaxf(t, part[w]);
  return t;
}

__device__ __forceinline__ float train_block_sum(float v) {
  __shared__ float part[32];
  __syncthreads();
  v = warp_sum(v);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  float t = 0.f;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) t += part[w];
  return t;
}

}  // namespace lathe::cuda::train
