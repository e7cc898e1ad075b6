// Dense GEMM through cuBLAS: row-major y[M, N] = x[M, K] · w[N, K]ᵀ is column-major yᵀ = w · xᵀ, i.e.
// gemm(T, N) with A = w (ld K), B = x (ld K), C = y (ld N). f32 runs in plain f32 (no TF32), bf16 with
// f32 accumulation.
#include <cublas_v2.h>

#include <string>

#include "common/error.h"
#include "tensor/cuda/cublas_api.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/runtime.h"

namespace lathe::cuda {

void gemm(const void* x, const void* w, DType t, int64_t M, int64_t N, int64_t K, void* y, DType yt) {
  if (M == 0 || N == 0) return;
  const float alpha = 1.f, beta = 0.f;
  auto ctype = [](DType d) {
    if (d == DType::F32) return CUDA_R_32F;
    if (d == DType::BF16) return CUDA_R_16BF;
    throw Error(ErrorKind::Unsupported, "gemm: element type #" + std::to_string(static_cast<int>(d)));
  };
  const cublasComputeType_t compute = t == DType::F32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
  check(
      cublas_api().gemm_ex(cublas(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(M),
                           static_cast<int>(K), &alpha, w, ctype(t), static_cast<int>(K), x, ctype(t),
                           static_cast<int>(K), &beta, y, ctype(yt), static_cast<int>(N), compute, CUBLAS_GEMM_DEFAULT),
      "cublasGemmEx");
}

}  // namespace lathe::cuda
