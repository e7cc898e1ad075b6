// Device memory hooks used by Tensor. Without the CUDA backend they throw a clear error.
#pragma once
#include <cstddef>

#include "tensor/tensor.h"

namespace lathe {

bool cuda_available();
void* device_alloc(size_t bytes);
void device_free(void* p);
void device_memset_zero(void* p, size_t bytes);
void device_copy(void* dst, const void* src, size_t bytes, Device dst_device, Device src_device);

}  // namespace lathe
