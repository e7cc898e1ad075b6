// Tensor::contiguous() for device tensors: one thread per output element walks the source strides. Used for
// views that kernels need dense (e.g. the query half of Qwen3.5's q|gate projection, a layer's PLE slice).
#include <mutex>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/runtime.h"
#include "tensor/device_memory.h"

namespace lathe {
namespace {

constexpr int kMaxDims = 6;

struct Layout {
  int nd = 0;
  int64_t shape[kMaxDims] = {};
  int64_t stride[kMaxDims] = {};
};

template <class E>
__global__ void strided_copy_kernel(E* __restrict__ dst, const E* __restrict__ src, const Layout l, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  int64_t rem = i, off = 0;
  for (int d = l.nd - 1; d >= 0; --d) {
    off += (rem % l.shape[d]) * l.stride[d];
    rem /= l.shape[d];
  }
  dst[i] = src[off];
}

}  // namespace

void device_strided_copy(void* dst, const void* src, const Shape& shape, const Shape& strides, size_t elem_size) {
  if (shape.size() > kMaxDims) throw Error(ErrorKind::Unsupported, "device contiguous(): more than 6 dimensions");
  Layout l;
  l.nd = static_cast<int>(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    l.shape[d] = shape[d];
    l.stride[d] = strides[d];
  }
  const int64_t n = shape_numel(shape);
  if (n == 0) return;
  // As device_copy: a call from another thread (the SSD tier's writer reading a kept cache) waits for a graph
  // capture on the shared stream instead of being recorded into it.
  const std::lock_guard<std::recursive_mutex> capture(cuda::capture_mutex());
  const unsigned blocks = cuda::blocks_for(n, 256);
  auto* s = cuda::stream();
  switch (elem_size) {
    case 1:
      strided_copy_kernel<<<blocks, 256, 0, s>>>(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), l, n);
      break;
    case 2:
      strided_copy_kernel<<<blocks, 256, 0, s>>>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), l, n);
      break;
    case 4:
      strided_copy_kernel<<<blocks, 256, 0, s>>>(static_cast<uint32_t*>(dst), static_cast<const uint32_t*>(src), l, n);
      break;
    case 8:
      strided_copy_kernel<<<blocks, 256, 0, s>>>(static_cast<uint64_t*>(dst), static_cast<const uint64_t*>(src), l, n);
      break;
    default: throw Error(ErrorKind::Unsupported, "device contiguous(): element size " + std::to_string(elem_size));
  }
  cuda::check_launch("strided_copy");
}

}  // namespace lathe
