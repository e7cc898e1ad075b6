// A set of tensors that share their first dimension (one row per token), moved and copied together: the
// storage of caches that keep more than a keys/values pair per token (quantized triples).
#pragma once
#include <vector>

#include "tensor/tensor.h"

namespace lathe {

struct RowTensors {
  std::vector<Tensor> parts;

  bool defined() const { return !parts.empty() && parts[0].defined(); }
  int64_t rows() const { return defined() ? parts[0].dim(0) : 0; }
  size_t nbytes() const;
  // Uninitialised storage for `rows` rows shaped like `like`'s rows, on its device.
  static RowTensors empty_like(const RowTensors& like, int64_t rows);
  RowTensors slice(int64_t begin, int64_t end) const;  // views
  RowTensors clone() const;
  // rows [src_row, src_row + n) of src into rows [dst_row, ...) of this.
  void copy_from(int64_t dst_row, const RowTensors& src, int64_t src_row, int64_t n);
};

}  // namespace lathe
