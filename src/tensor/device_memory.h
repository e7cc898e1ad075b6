// Device memory hooks used by Tensor. Without the CUDA backend they throw a clear error.
#pragma once
#include <cstddef>
#include <cstdint>

#include "tensor/tensor.h"

namespace lathe {

bool cuda_available();
void* device_alloc(size_t bytes);
void device_free(void* p);
void device_memset_zero(void* p, size_t bytes);
// Host<->device copies return once the host buffer may be reused; device->device copies are stream-ordered.
void device_copy(void* dst, const void* src, size_t bytes, Device dst_device, Device src_device);
void device_synchronize();  // waits for all queued device work
// Gathers a strided device tensor (≤ 6 dims, element strides) into contiguous dst on the device, stream-ordered
// (views such as a head slice become contiguous without a trip through host memory).
void device_strided_copy(void* dst, const void* src, const Shape& shape, const Shape& strides, size_t elem_size);

// The caching allocator's counters. malloc_calls counts real cudaMalloc calls: a loop that adds none
// allocated nothing on the device.
struct DeviceMemoryStats {
  uint64_t malloc_calls = 0;    // cudaMalloc calls
  uint64_t alloc_requests = 0;  // tensor allocations served (cache hits included)
  size_t reserved_bytes = 0, peak_reserved_bytes = 0;
  size_t in_use_bytes = 0, peak_in_use_bytes = 0;
};
DeviceMemoryStats device_memory_stats();
// The bytes a device allocation of `bytes` really takes (the caching allocator's size class): what a buffer may
// grow into for free. `bytes` where there is no device allocator.
size_t device_alloc_size(size_t bytes);
void device_reset_peak();
void device_release_cached();

}  // namespace lathe
