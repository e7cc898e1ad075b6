#include "tensor/device_readback.h"

#include <cstring>
#include <vector>

#include "common/error.h"
#ifdef LATHE_HAVE_CUDA
#include <cuda_runtime.h>

#include "tensor/cuda/runtime.h"
#endif

namespace lathe {

struct DeviceReadback::Impl {
  std::vector<char> host;  // CPU tensors
#ifdef LATHE_HAVE_CUDA
  void* pinned = nullptr;
  size_t capacity = 0;
  cudaEvent_t done = nullptr;
  ~Impl() {
    if (done) {
      cudaEventSynchronize(done);
      cudaEventDestroy(done);
    }
    if (pinned) cudaFreeHost(pinned);
  }
#endif
  bool on_device = false;
};

DeviceReadback::DeviceReadback() : impl_(std::make_unique<Impl>()) {}
DeviceReadback::~DeviceReadback() = default;

void DeviceReadback::start(const Tensor& t) {
  LATHE_CHECK(t.is_contiguous(), "DeviceReadback: expects a contiguous tensor");
  const size_t bytes = static_cast<size_t>(t.numel()) * dtype_size(t.dtype());
  Impl& m = *impl_;
  m.on_device = t.device() == Device::CUDA;
  if (!m.on_device) {
    m.host.assign(static_cast<const char*>(t.raw()), static_cast<const char*>(t.raw()) + bytes);
    return;
  }
#ifdef LATHE_HAVE_CUDA
  if (!m.done) LATHE_CUDA_CHECK(cudaEventCreateWithFlags(&m.done, cudaEventDisableTiming));
  if (bytes > m.capacity) {
    LATHE_CUDA_CHECK(cudaEventSynchronize(m.done));  // the old buffer may still be a copy's destination
    if (m.pinned) cudaFreeHost(m.pinned);
    m.pinned = nullptr;
    m.capacity = 0;
    LATHE_CUDA_ALLOC_CHECK(cudaMallocHost(&m.pinned, bytes), "pinned host", bytes);
    m.capacity = bytes;
  }
  LATHE_CUDA_CHECK(cudaMemcpyAsync(m.pinned, t.raw(), bytes, cudaMemcpyDeviceToHost, cuda::stream()));
  LATHE_CUDA_CHECK(cudaEventRecord(m.done, cuda::stream()));
#else
  throw Error(ErrorKind::Unsupported, "DeviceReadback: a CUDA tensor in a build without CUDA");
#endif
}

const void* DeviceReadback::wait() {
  Impl& m = *impl_;
  if (!m.on_device) return m.host.data();
#ifdef LATHE_HAVE_CUDA
  LATHE_CUDA_CHECK(cudaEventSynchronize(m.done));
  return m.pinned;
#else
  return nullptr;
#endif
}

}  // namespace lathe
