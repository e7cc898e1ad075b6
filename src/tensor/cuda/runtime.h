// The CUDA runtime lathe uses: one device, one stream that every kernel and copy is ordered on, one cuBLAS
// handle bound to it, and error checks that turn CUDA failures into lathe::Error.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <mutex>

namespace lathe::cuda {

cudaStream_t stream();
cublasHandle_t cublas();
int sm_count();
// Whether launch_dependent (common.cuh) uses programmatic dependent launch; LATHE_CUDA_PDL=0 turns it off.
bool pdl_enabled();
// Held by the thread that captures a graph, from the capture's start to its end, and by device_copy: a copy that
// another thread issues meanwhile (the SSD tier's writer reading a cache) waits for the capture to end instead
// of being recorded into the graph on the shared stream (and never run).
std::recursive_mutex& capture_mutex();

void check(cudaError_t e, const char* what);
void check(cublasStatus_t s, const char* what);
// After cudaMalloc / cudaMallocHost of `bytes`: running out (cudaErrorMemoryAllocation) is an OsError of ENOMEM,
// "out of <memory> memory allocating <bytes> bytes (<what>)" (`memory`: "device", "pinned host"), which the server
// answers with 503 insufficient_memory (server/api_error.h); any other failure is check()'s.
void check_alloc(cudaError_t e, const char* memory, size_t bytes, const char* what);
// After a kernel launch: reports a bad configuration (or an earlier asynchronous fault) by name.
void check_launch(const char* kernel);

}  // namespace lathe::cuda

#define LATHE_CUDA_CHECK(expr) ::lathe::cuda::check((expr), #expr)
#define LATHE_CUDA_ALLOC_CHECK(expr, memory, bytes) ::lathe::cuda::check_alloc((expr), (memory), (bytes), #expr)
