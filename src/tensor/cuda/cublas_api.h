// cuBLAS, opened on first use (dlopen) instead of linked: a CUDA build that runs on --device cpu never maps it
// (libcublasLt alone was ~60 MiB resident in every process). The handful of entry points lathe calls, resolved
// once; the types and enums still come from the header.
#pragma once
#include <cublas_v2.h>

namespace lathe::cuda {

struct CublasApi {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetWorkspace_v2) set_workspace = nullptr;
  // The 32-bit-size entry points (the header also declares C++ overloads under these names, so spelled out).
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                            const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                            cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
  cublasStatus_t (*gemm_strided_batched_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                            const void*, const void*, cudaDataType, int, long long, const void*,
                                            cudaDataType, int, long long, const void*, void*, cudaDataType, int,
                                            long long, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
};

// Loads libcublas.so.<major of the headers> on the first call (the loader's search path, then the toolkit's
// library directory this build found); throws an Error naming the library when it or a symbol is missing.
const CublasApi& cublas_api();

}  // namespace lathe::cuda
