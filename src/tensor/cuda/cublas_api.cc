#include "tensor/cuda/cublas_api.h"

#include <dlfcn.h>

#include <string>

#include "common/error.h"

namespace lathe::cuda {
namespace {

template <class Fn>
void resolve(void* lib, const char* name, Fn& out) {
  out = reinterpret_cast<Fn>(dlsym(lib, name));
  if (!out) throw Error(ErrorKind::Internal, std::string("cuBLAS has no ") + name + " (a different major version?)");
}

CublasApi load() {
  const std::string soname = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
  std::string tried = soname;
  void* lib = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
#ifdef LATHE_CUDA_LIB_DIR
  if (!lib) {  // not on the loader's path: the toolkit this binary was built against
    const std::string path = std::string(LATHE_CUDA_LIB_DIR) + "/" + soname;
    tried += ", " + path;
    lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  }
#endif
  if (!lib) {
    const char* why = dlerror();
    throw Error(ErrorKind::Io, "cannot load cuBLAS (tried " + tried + "): " + (why ? why : "not found") +
                                   "; install the CUDA " + std::to_string(CUBLAS_VER_MAJOR) +
                                   " runtime libraries or add their directory to LD_LIBRARY_PATH");
  }
  CublasApi api;
  resolve(lib, "cublasCreate_v2", api.create);
  resolve(lib, "cublasSetStream_v2", api.set_stream);
  resolve(lib, "cublasSetWorkspace_v2", api.set_workspace);
  resolve(lib, "cublasGemmEx", api.gemm_ex);
  resolve(lib, "cublasGemmStridedBatchedEx", api.gemm_strided_batched_ex);
  return api;  // the library stays open for the process
}

}  // namespace

const CublasApi& cublas_api() {
  static const CublasApi api = load();
  return api;
}

}  // namespace lathe::cuda
