// Device helpers shared by the kernels: f32 <-> element conversions, warp reductions, type dispatch.
#pragma once
#include <cuda_bf16.h>

#include <algorithm>
#include <string>
#include <utility>

#include "common/error.h"
#include "tensor/cuda/runtime.h"
#include "tensor/dtype.h"

namespace lathe::cuda {

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ float from_f<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Eight bf16 values (one 16-byte load) widened to f32.
__device__ __forceinline__ void bf16x8(const uint4 v, float* f) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    f[2 * e] = __uint_as_float(w[e] << 16);
    f[2 * e + 1] = __uint_as_float(w[e] & 0xffff0000u);
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide sum over blockDim.x threads (a multiple of 32, ≤ 1024); every thread gets the total.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float part[32];
  v = warp_sum(v);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    float p = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.f;
    p = warp_sum(p);
    if (threadIdx.x == 0) part[0] = p;
  }
  __syncthreads();
  return part[0];
}

// RMSNorm gain of element i: w[i] (w[i] + 1 for weights stored as offsets from 1), or 1 without weights.
__device__ __forceinline__ float norm_gain(const float* w, int64_t i, bool plus_one) {
  return w ? (plus_one ? w[i] + 1.0f : w[i]) : 1.0f;
}

// Launch shape of the one-block-per-row norm kernels, which keep a row in registers: 8 values per thread up to
// 8192 (every hidden size in use), 32 up to 32768 (`wide`); threads a multiple of 32.
struct NormRowLaunch {
  bool wide = false;
  int threads = 32;
};
inline NormRowLaunch norm_row_launch(int64_t D, const char* op) {
  if (D > 32 * 1024) throw Error(ErrorKind::Unsupported, std::string(op) + ": rows above 32768 values on CUDA");
  NormRowLaunch l;
  l.wide = D > 8 * 1024;
  const int per = l.wide ? 32 : 8;
  l.threads = static_cast<int>(std::max<int64_t>(32, (D + per * 32 - 1) / (per * 32) * 32));
  return l;
}

// Programmatic dependent launch (sm_90). A kernel launched by launch_dependent() may start while the previous
// kernel of the stream still runs: before pdl_wait() it may only read data that no earlier kernel writes (weights)
// and must not write at all; pdl_wait() returns once the previous kernel has finished and its writes are
// visible. Kernels that often precede one call pdl_trigger() at their start, so the dependent is scheduled as
// soon as all their blocks run (without it, it starts when they finish). Both are no-ops on older devices.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Launches kernel<<<grid, block, smem, stream()>>>(args...) as a programmatic dependent of the previous kernel
// when pdl_enabled(); the kernel must call pdl_wait() as described above.
template <class... Params, class... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, Args&&... args) {
  if (!pdl_enabled()) {
    kernel<<<grid, block, smem, stream()>>>(std::forward<Args>(args)...);
    return;
  }
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream();
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);  // errors surface in check_launch()
}

inline unsigned blocks_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

// Asynchronous 16-byte copies global → shared (sm_80+), past L1; `valid` false zero-fills the 16 bytes instead
// (src-size 0), for tiles that run past their matrix. Commit a group, then wait until at most N groups are pending.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid = true) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

[[noreturn]] inline void bad_dtype(const char* op, DType t) {
  throw Error(ErrorKind::Unsupported,
              std::string(op) + ": no CUDA kernel for element type #" + std::to_string(static_cast<int>(t)));
}

}  // namespace lathe::cuda

// Runs BODY with T bound to the element type of `dt` (F32 or BF16).
#define LATHE_DISPATCH_ACT(dt, op, T, ...)     \
  do {                                         \
    if ((dt) == ::lathe::DType::F32) {         \
      using T = float;                         \
      __VA_ARGS__;                             \
    } else if ((dt) == ::lathe::DType::BF16) { \
      using T = __nv_bfloat16;                 \
      __VA_ARGS__;                             \
    } else {                                   \
      ::lathe::cuda::bad_dtype(op, dt);        \
    }                                          \
  } while (0)
