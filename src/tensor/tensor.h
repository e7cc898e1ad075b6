// Tensor: dtype + shape + strides over shared storage. Storage is heap memory, device memory, or pages of a
// mapped file (zero-copy weights); views share storage and differ only in offset/shape/strides.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "tensor/dtype.h"

namespace lathe {

enum class Device : uint8_t { CPU, CUDA };
const char* device_name(Device d);

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

struct Storage {
  void* data = nullptr;
  size_t bytes = 0;
  Device device = Device::CPU;
  std::shared_ptr<void> owner;  // keeps the memory alive (heap block, mapping, device block)
};

class Tensor {
 public:
  Tensor() = default;

  // New contiguous CPU (or device) tensor; contents uninitialised / zeroed.
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::CPU);
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::CPU);
  // Aliases memory owned by `owner` (e.g. a file mapping) without copying.
  static Tensor alias(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> owner,
                      Device device = Device::CPU);
  static Tensor from_floats(const std::vector<float>& values, const Shape& shape);
  static Tensor from_ints(const std::vector<int32_t>& values, const Shape& shape);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device : Device::CPU; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }  // in elements
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_[static_cast<size_t>(i < 0 ? i + ndim() : i)]; }
  int64_t stride(int i) const { return strides_[static_cast<size_t>(i < 0 ? i + ndim() : i)]; }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  void* raw() const { return static_cast<char*>(storage_->data) + offset_bytes_; }
  template <class T>
  T* data() const {
    return static_cast<T*>(raw());
  }

  // Views (no copy).
  Tensor reshape(const Shape& shape) const;  // requires contiguous; one dim may be -1
  Tensor slice(int dim, int64_t begin, int64_t end) const;
  Tensor select(int dim, int64_t index) const;  // drops the dimension
  Tensor transpose(int a, int b) const;

  // Copies.
  Tensor contiguous() const;
  Tensor clone() const;
  Tensor to(DType dtype) const;          // CPU conversion between float types (and int widths)
  Tensor to(Device device) const;        // host <-> device copy
  std::vector<float> to_floats() const;  // any float dtype, any strides, CPU or device

  std::string describe() const;  // "BF16[4, 64]"

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_bytes_ = 0;
  DType dtype_ = DType::F32;
  Shape shape_;
  Shape strides_;
};

Shape contiguous_strides(const Shape& shape);

}  // namespace lathe
