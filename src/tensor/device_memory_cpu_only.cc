// Fallback when lathe is built without CUDA: every device request fails with a message that says why.
#ifndef LATHE_HAVE_CUDA
#include "common/error.h"
#include "tensor/device_memory.h"

namespace lathe {
namespace {
[[noreturn]] void no_cuda() {
  throw Error(ErrorKind::Unsupported, "this lathe binary was built without the CUDA backend (nvcc was not found)");
}
}  // namespace
bool cuda_available() { return false; }
void* device_alloc(size_t) { no_cuda(); }
void device_free(void*) {}
void device_memset_zero(void*, size_t) { no_cuda(); }
void device_copy(void*, const void*, size_t, Device, Device) { no_cuda(); }
void device_synchronize() {}
void device_strided_copy(void*, const void*, const Shape&, const Shape&, size_t) { no_cuda(); }
DeviceMemoryStats device_memory_stats() { return {}; }
size_t device_alloc_size(size_t bytes) { return bytes; }
void device_reset_peak() {}
void device_release_cached() {}
}  // namespace lathe
#endif
