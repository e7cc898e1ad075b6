#include "cache/row_tensors.h"

#include <cstring>

#include "common/error.h"

namespace lathe {

size_t RowTensors::nbytes() const {
  size_t n = 0;
  for (const Tensor& t : parts) n += t.defined() ? t.nbytes() : 0;
  return n;
}

RowTensors RowTensors::empty_like(const RowTensors& like, int64_t rows) {
  RowTensors out;
  for (const Tensor& t : like.parts) {
    Shape s = t.shape();
    s[0] = rows;
    out.parts.push_back(Tensor::empty(s, t.dtype()));
  }
  return out;
}

RowTensors RowTensors::slice(int64_t begin, int64_t end) const {
  RowTensors out;
  for (const Tensor& t : parts) out.parts.push_back(t.slice(0, begin, end));
  return out;
}

RowTensors RowTensors::clone() const {
  RowTensors out;
  for (const Tensor& t : parts) out.parts.push_back(t.clone());
  return out;
}

void RowTensors::copy_from(int64_t dst_row, const RowTensors& src, int64_t src_row, int64_t n) {
  LATHE_CHECK(src.parts.size() == parts.size(), "RowTensors: part counts differ");
  if (n <= 0) return;
  for (size_t i = 0; i < parts.size(); ++i) {
    Tensor& d = parts[i];
    const Tensor s = src.parts[i].contiguous();
    const size_t row = static_cast<size_t>(d.numel() / d.dim(0)) * dtype_size(d.dtype());
    LATHE_CHECK(s.dtype() == d.dtype() && static_cast<size_t>(s.numel() / s.dim(0)) * dtype_size(s.dtype()) == row,
                "RowTensors: row layouts differ");
    LATHE_CHECK(dst_row + n <= d.dim(0) && src_row + n <= s.dim(0), "RowTensors: copy out of range");
    std::memcpy(static_cast<char*>(d.raw()) + static_cast<size_t>(dst_row) * row,
                static_cast<const char*>(s.raw()) + static_cast<size_t>(src_row) * row, static_cast<size_t>(n) * row);
  }
}

}  // namespace lathe
