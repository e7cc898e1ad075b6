// The CUDA side of ops.h: the same operations over device tensors, called by ops.cc when the inputs live on
// the GPU. Activations are F32 or BF16; outputs keep the input's type unless said otherwise. Only compiled
// with the CUDA backend (LATHE_HAVE_CUDA).
#pragma once
#include <vector>

#include "tensor/ops.h"

namespace lathe::gpu {

Tensor linear(const Tensor& x, const Weight& w, const Tensor* bias, bool f32_out);
Tensor embedding(const std::vector<int32_t>& ids, const Weight& table, DType out);
Tensor dequantize(const QuantizedMatrix& q, int64_t row0, int64_t n, DType out);
Tensor rms_norm(const Tensor& x, const Tensor& weight, float eps, bool plus_one, DType out);
void rope_inplace(Tensor& x, const RopeTable& rope, int64_t pos0);
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p);
Tensor gated(const Tensor& gate, const Tensor& up, bool gelu);
void add_inplace(Tensor& a, const Tensor& b);
void scale_inplace(Tensor& x, float s);
void softcap_inplace(Tensor& x, float cap);
std::vector<int32_t> argmax_rows(const Tensor& x);
void copy_rows(void* dst, int64_t dst_row, const void* src_rows, int64_t n, size_t row_bytes);

}  // namespace lathe::gpu
