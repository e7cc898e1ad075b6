// f32 GEMM of the training autograd through cuBLAS. Row-major C = op(A) · op(B) is column-major
// Cᵀ = op(B)ᵀ · op(A)ᵀ: a row-major matrix read column-major is its transpose, so B goes first with its own
// transpose flag and A second. The pedantic f32 compute type keeps cuBLAS off TF32 whatever the handle's mode.
#include <cublas_v2.h>

#include "tensor/cuda/cublas_api.h"
#include "tensor/cuda/runtime.h"
#include "tensor/cuda/train_kernels.h"

namespace lathe::cuda::train {
namespace {
bool g_sgemm_bf16 = false;
}

void set_sgemm_bf16(bool on) { g_sgemm_bf16 = on; }
bool sgemm_bf16() { return g_sgemm_bf16; }

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  check(cublas_api().gemm_ex(
            cublas(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(N),
            static_cast<int>(M), static_cast<int>(K), &alpha, B, CUDA_R_32F, static_cast<int>(ldb), A, CUDA_R_32F,
            static_cast<int>(lda), &beta, C, CUDA_R_32F, static_cast<int>(ldc),
            g_sgemm_bf16 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx (train sgemm)");
}

void sgemm_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                   int64_t lda, int64_t sa, const float* B, int64_t ldb, int64_t sb, float beta, float* C, int64_t ldc,
                   int64_t sc, int64_t batch) {
  if (M == 0 || N == 0 || batch == 0) return;
  check(cublas_api().gemm_strided_batched_ex(
            cublas(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(N),
            static_cast<int>(M), static_cast<int>(K), &alpha, B, CUDA_R_32F, static_cast<int>(ldb), sb, A, CUDA_R_32F,
            static_cast<int>(lda), sa, &beta, C, CUDA_R_32F, static_cast<int>(ldc), sc, static_cast<int>(batch),
            g_sgemm_bf16 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT),
        "cublasGemmStridedBatchedEx (train sgemm_batched)");
}

}  // namespace lathe::cuda::train
