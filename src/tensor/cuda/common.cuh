// Device helpers shared by the kernels: f32 <-> element conversions, warp reductions, type dispatch.
#pragma once
#include <cuda_bf16.h>

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
