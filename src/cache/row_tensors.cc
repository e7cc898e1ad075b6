#include "cache/row_tensors.h"

#include "common/error.h"
#include "tensor/ops.h"

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
    out.parts.push_back(Tensor::empty(s, t.dtype(), t.device()));
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
  // copy_rows checks the layouts and copies on the parts' device (a memcpy on the CPU).
  for (size_t i = 0; i < parts.size(); ++i) copy_rows(parts[i], dst_row, src.parts[i], src_row, n);
}

}  // namespace lathe
