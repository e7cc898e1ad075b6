// Row argmax (greedy decoding, tests). A vocabulary row (~150k logits) read by one block was latency-bound on
// one SM (~50 µs); a few rows are split over many blocks, each reducing its column range to (value, index),
// then one warp per row picks the winner. Larger value wins, the lower index on ties, as on the CPU.
#include <cfloat>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/kernels.h"
#include "tensor/device_memory.h"

namespace lathe::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kSplit = 64;  // blocks per row on the split path
constexpr int kUnroll = 4;  // loads in flight per thread

// (value, index) pairs: index < 0 = none yet.
__device__ __forceinline__ void take(float& best, int& idx, float v, int i) {
  if (i >= 0 && (idx < 0 || v > best || (v == best && i < idx))) {
    best = v;
    idx = i;
  }
}

__device__ __forceinline__ void warp_best(float& best, int& idx) {
  for (int o = 16; o > 0; o >>= 1)
    take(best, idx, __shfl_xor_sync(0xffffffffu, best, o), __shfl_xor_sync(0xffffffffu, idx, o));
}

// Block-wide winner of (best, idx); valid in thread 0.
__device__ __forceinline__ void block_best(float& best, int& idx) {
  __shared__ float sv[32];
  __shared__ int si[32];
  warp_best(best, idx);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) {
    sv[warp] = best;
    si[warp] = idx;
  }
  __syncthreads();
  if (warp == 0) {
    best = lane < static_cast<int>(blockDim.x >> 5) ? sv[lane] : -FLT_MAX;
    idx = lane < static_cast<int>(blockDim.x >> 5) ? si[lane] : -1;
    warp_best(best, idx);
  }
}

// Grid (blocks per row, rows): block b of a row scans columns [b·per, (b+1)·per).
template <class T>
__global__ void argmax_part_kernel(const T* __restrict__ x, int64_t cols, int64_t per, float* __restrict__ pv,
                                   int* __restrict__ pi, int32_t* __restrict__ out) {
  const T* row = x + blockIdx.y * cols;
  const int64_t c0 = blockIdx.x * per, c1 = min(cols, c0 + per);
  float best = -FLT_MAX;
  int idx = -1;
  for (int64_t i = c0 + threadIdx.x; i < c1; i += kUnroll * blockDim.x) {
    float v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t j = i + u * blockDim.x;
      v[u] = j < c1 ? to_f(row[j]) : -FLT_MAX;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (i + u * blockDim.x < c1) take(best, idx, v[u], static_cast<int>(i + u * blockDim.x));
  }
  block_best(best, idx);
  if (threadIdx.x != 0) return;
  if (out) {
    out[blockIdx.y] = idx < 0 ? 0 : idx;
  } else {
    pv[blockIdx.y * gridDim.x + blockIdx.x] = best;
    pi[blockIdx.y * gridDim.x + blockIdx.x] = idx;
  }
}

// One warp per row over its kSplit partial winners.
__global__ void argmax_final_kernel(const float* __restrict__ pv, const int* __restrict__ pi, int parts,
                                    int32_t* __restrict__ out) {
  float best = -FLT_MAX;
  int idx = -1;
  for (int p = threadIdx.x; p < parts; p += 32) take(best, idx, pv[blockIdx.x * parts + p], pi[blockIdx.x * parts + p]);
  warp_best(best, idx);
  if (threadIdx.x == 0) out[blockIdx.x] = idx < 0 ? 0 : idx;
}

}  // namespace

void argmax_rows(const void* x, DType t, int64_t rows, int64_t cols, int32_t* out) {
  if (rows == 0) return;
  if (cols >= (int64_t{1} << 31)) throw Error(ErrorKind::Unsupported, "argmax: rows of 2^31 values or more on CUDA");
  // Many rows fill the chip one block per row; a few long rows are split.
  const bool split = rows <= 16 && cols >= 16 * kThreads;
  LATHE_DISPATCH_ACT(t, "argmax", T, {
    if (!split) {
      argmax_part_kernel<T><<<dim3(1, static_cast<unsigned>(rows)), kThreads, 0, stream()>>>(
          static_cast<const T*>(x), cols, cols, nullptr, nullptr, out);
    } else {
      auto* pv = static_cast<float*>(device_alloc(static_cast<size_t>(rows * kSplit) * sizeof(float)));
      auto* pi = static_cast<int*>(device_alloc(static_cast<size_t>(rows * kSplit) * sizeof(int)));
      const int64_t per = (cols + kSplit - 1) / kSplit;
      argmax_part_kernel<T><<<dim3(kSplit, static_cast<unsigned>(rows)), kThreads, 0, stream()>>>(
          static_cast<const T*>(x), cols, per, pv, pi, nullptr);
      argmax_final_kernel<<<static_cast<unsigned>(rows), 32, 0, stream()>>>(pv, pi, kSplit, out);
      device_free(pv);
      device_free(pi);
    }
  });
  check_launch("argmax");
}

}  // namespace lathe::cuda
