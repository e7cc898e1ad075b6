#include "tensor/tensor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <utility>
#include <vector>

#include "common/error.h"
#include "tensor/device_memory.h"
#include "tensor/host_buffer_cache.h"

namespace lathe {

const char* device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
  return os.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t acc = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    st[i] = acc;
    acc *= shape[i];
  }
  return st;
}

namespace {

std::shared_ptr<Storage> make_storage(size_t bytes, Device device) {
  auto st = std::make_shared<Storage>();
  st->bytes = bytes;
  st->device = device;
  if (device == Device::CPU) {
    size_t capacity = 0;
    void* p = acquire_host_buffer(bytes, &capacity);
    st->data = p;
    st->owner = std::shared_ptr<void>(p, [capacity](void* q) { release_host_buffer(q, capacity); });
  } else {
    st->data = device_alloc(bytes);
    st->owner = std::shared_ptr<void>(st->data, [](void* q) { device_free(q); });
  }
  return st;
}
}  // namespace

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape)
    if (d < 0) throw Error(ErrorKind::InvalidArgument, "negative dimension in shape " + shape_str(shape));
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.storage_ = make_storage(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), device);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  if (device == Device::CPU)
    std::memset(t.raw(), 0, t.nbytes());
  else
    device_memset_zero(t.raw(), t.nbytes());
  return t;
}

Tensor Tensor::alias(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> owner, Device device) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  auto st = std::make_shared<Storage>();
  st->data = data;
  st->bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  st->device = device;
  st->owner = std::move(owner);
  t.storage_ = std::move(st);
  return t;
}

Tensor Tensor::from_floats(const std::vector<float>& values, const Shape& shape) {
  LATHE_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "from_floats size");
  Tensor t = empty(shape, DType::F32);
  std::memcpy(t.raw(), values.data(), values.size() * 4);
  return t;
}

Tensor Tensor::from_ints(const std::vector<int32_t>& values, const Shape& shape) {
  LATHE_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "from_ints size");
  Tensor t = empty(shape, DType::I32);
  std::memcpy(t.raw(), values.data(), values.size() * 4);
  return t;
}

bool Tensor::is_contiguous() const {
  int64_t acc = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] != 1 && strides_[i] != acc) return false;
    acc *= shape_[i];
  }
  return true;
}

Tensor Tensor::reshape(const Shape& shape) const {
  Shape s = shape;
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      LATHE_CHECK(infer < 0, "reshape: more than one -1");
      infer = static_cast<int>(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) s[static_cast<size_t>(infer)] = known ? numel() / known : 0;
  LATHE_CHECK(shape_numel(s) == numel(), "reshape " + describe() + " to " + shape_str(shape));
  if (!is_contiguous()) return contiguous().reshape(s);
  Tensor t = *this;
  t.shape_ = s;
  t.strides_ = contiguous_strides(s);
  return t;
}

Tensor Tensor::slice(int d, int64_t begin, int64_t end) const {
  if (d < 0) d += ndim();
  LATHE_CHECK(d >= 0 && d < ndim() && begin >= 0 && begin <= end && end <= shape_[static_cast<size_t>(d)],
              "slice out of range on " + describe());
  Tensor t = *this;
  t.offset_bytes_ += static_cast<size_t>(begin * strides_[static_cast<size_t>(d)]) * dtype_size(dtype_);
  t.shape_[static_cast<size_t>(d)] = end - begin;
  return t;
}

Tensor Tensor::select(int d, int64_t index) const {
  if (d < 0) d += ndim();
  Tensor t = slice(d, index, index + 1);
  t.shape_.erase(t.shape_.begin() + d);
  t.strides_.erase(t.strides_.begin() + d);
  return t;
}

Tensor Tensor::transpose(int a, int b) const {
  if (a < 0) a += ndim();
  if (b < 0) b += ndim();
  Tensor t = *this;
  std::swap(t.shape_[static_cast<size_t>(a)], t.shape_[static_cast<size_t>(b)]);
  std::swap(t.strides_[static_cast<size_t>(a)], t.strides_[static_cast<size_t>(b)]);
  return t;
}

namespace {
// Visits every element offset (in elements) of a strided CPU tensor in row-major order.
template <class F>
void for_each_offset(const Shape& shape, const Shape& strides, F&& f) {
  const size_t nd = shape.size();
  int64_t n = shape_numel(shape);
  if (n == 0) return;
  if (nd == 0) {
    f(0);
    return;
  }
  std::vector<int64_t> idx(nd, 0);
  int64_t off = 0;
  const int64_t inner = shape[nd - 1], inner_stride = strides[nd - 1];
  for (int64_t done = 0; done < n; done += inner) {
    for (int64_t j = 0; j < inner; ++j) f(off + j * inner_stride);
    for (size_t k = nd - 1; k-- > 0;) {
      if (++idx[k] < shape[k]) {
        off += strides[k];
        break;
      }
      off -= strides[k] * (shape[k] - 1);
      idx[k] = 0;
    }
  }
}
}  // namespace

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  if (device() != Device::CPU) {
    Tensor out = empty(shape_, dtype_, device());
    device_strided_copy(out.raw(), raw(), shape_, strides_, dtype_size(dtype_));
    return out;
  }
  Tensor out = empty(shape_, dtype_);
  const size_t es = dtype_size(dtype_);
  const char* src = static_cast<const char*>(raw());
  char* dst = static_cast<char*>(out.raw());
  // Copy contiguous inner runs at once when the last dim is dense.
  if (ndim() >= 1 && strides_.back() == 1) {
    Shape outer(shape_.begin(), shape_.end() - 1), outer_st(strides_.begin(), strides_.end() - 1);
    const size_t run = static_cast<size_t>(shape_.back()) * es;
    size_t pos = 0;
    for_each_offset(outer, outer_st, [&](int64_t off) {
      std::memcpy(dst + pos, src + off * static_cast<int64_t>(es), run);
      pos += run;
    });
    if (outer.empty()) std::memcpy(dst, src, run);
    return out;
  }
  size_t pos = 0;
  for_each_offset(shape_, strides_, [&](int64_t off) {
    std::memcpy(dst + pos, src + off * static_cast<int64_t>(es), es);
    pos += es;
  });
  return out;
}

Tensor Tensor::clone() const {
  Tensor c = contiguous();
  if (c.storage_ != storage_ || c.offset_bytes_ != offset_bytes_) return c;
  Tensor out = empty(shape_, dtype_, device());
  if (device() == Device::CPU)
    std::memcpy(out.raw(), raw(), nbytes());
  else
    device_copy(out.raw(), raw(), nbytes(), Device::CUDA, Device::CUDA);
  return out;
}

std::vector<float> Tensor::to_floats() const {
  if (device() != Device::CPU) return to(Device::CPU).to_floats();
  Tensor c = contiguous();
  const int64_t n = c.numel();
  std::vector<float> out(static_cast<size_t>(n));
  switch (c.dtype()) {
    case DType::F32: std::memcpy(out.data(), c.raw(), static_cast<size_t>(n) * 4); break;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = bf16_to_f32(c.data<uint16_t>()[i]);
      break;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = f16_to_f32(c.data<uint16_t>()[i]);
      break;
    case DType::F64:
      for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = static_cast<float>(c.data<double>()[i]);
      break;
    case DType::I32:
      for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = static_cast<float>(c.data<int32_t>()[i]);
      break;
    default: throw Error(ErrorKind::Unsupported, std::string("to_floats from ") + dtype_name(c.dtype()));
  }
  return out;
}

Tensor Tensor::to(DType target) const {
  if (target == dtype_) return *this;
  if (device() != Device::CPU) return to(Device::CPU).to(target).to(device());
  std::vector<float> f = to_floats();
  Tensor out = empty(shape_, target);
  const size_t n = f.size();
  switch (target) {
    case DType::F32: std::memcpy(out.raw(), f.data(), n * 4); break;
    case DType::BF16:
      for (size_t i = 0; i < n; ++i) out.data<uint16_t>()[i] = f32_to_bf16(f[i]);
      break;
    case DType::F16:
      for (size_t i = 0; i < n; ++i) out.data<uint16_t>()[i] = f32_to_f16(f[i]);
      break;
    default: throw Error(ErrorKind::Unsupported, std::string("conversion to ") + dtype_name(target));
  }
  return out;
}

Tensor Tensor::to(Device target) const {
  if (target == device()) return *this;
  Tensor src = contiguous();
  Tensor out = empty(shape_, dtype_, target);
  device_copy(out.raw(), src.raw(), nbytes(), target, src.device());
  return out;
}

std::string Tensor::describe() const { return std::string(dtype_name(dtype_)) + shape_str(shape_); }

}  // namespace lathe
