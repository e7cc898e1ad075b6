// Device dispatch for the fused ops of ops_extra.h (q/k RMSNorm + RoPE, residual add + RMSNorm): checks,
// output allocation, one kernel launch each (tensor/cuda/fused.cu).
#ifdef LATHE_HAVE_CUDA
#include <cstring>
#include "common/error.h"
#include "tensor/cuda/kernels_models.h"
#include "tensor/ops_cuda.h"
#include "tensor/ops_cuda_check.h"
#include "tensor/ops_extra.h"

namespace lathe::gpu {

Tensor rms_norm_rope(const Tensor& x_in, const Tensor& weight, float eps, bool plus_one, const RopeTable& rope,
                     int64_t pos0) {
  require_act(x_in, "rms_norm_rope");
  const Tensor x = x_in.contiguous();
  Tensor out = Tensor::empty(x.shape(), x.dtype(), Device::CUDA);
  cuda::rms_norm_rope(x.raw(), out.raw(), x.dtype(), x.dim(0), x.dim(1), x.dim(2), f32_ptr(&weight, "rms_norm_rope"),
                      eps, plus_one, rope.inv_freq.data(), rope.dims, rope.attention_scaling, pos0);
  return out;
}

Tensor add_rms_norm(Tensor& h, const Tensor& b_in, const Tensor& weight, float eps, bool plus_one, DType out_type) {
  require_act(h, "add_rms_norm");
  require_act(b_in, "add_rms_norm");
  const Tensor b = b_in.contiguous();
  Tensor out = Tensor::empty(h.shape(), out_type, Device::CUDA);
  const int64_t D = h.dim(-1);
  cuda::add_rms_norm(h.raw(), h.dtype(), b.raw(), b.dtype(), out.raw(), out_type, h.numel() / D, D,
                     f32_ptr(&weight, "add_rms_norm"), eps, plus_one);
  return out;
}

Tensor qkv_rope_append(const Tensor& y, const QkvStep& s, const RopeTable& rope, int64_t pos0, Tensor& keys,
                       Tensor& values, int64_t row) {
  require_act(y, "qkv_rope_append");
  require_act(keys, "qkv_rope_append");
  require_act(values, "qkv_rope_append");
  LATHE_CHECK(keys.is_contiguous() && values.is_contiguous(), "qkv_rope_append: cache buffers must be contiguous");
  Tensor q = Tensor::empty({1, s.q_heads, s.head_dim}, y.dtype(), Device::CUDA);
  const float* qw = s.norm ? f32_ptr(&s.q_w, "qkv_rope_append") : nullptr;
  const float* kw = s.norm ? f32_ptr(&s.k_w, "qkv_rope_append") : nullptr;
  cuda::qkv_rope_append(y.raw(), q.raw(), keys.raw(), values.raw(), y.dtype(), row, s.q_heads, s.kv_heads, s.head_dim,
                        s.norm, qw, kw, s.eps, s.plus_one, rope.inv_freq.data(), rope.dims, rope.attention_scaling,
                        pos0);
  return q;
}

Tensor qkv_rope_append_rows(const Tensor& y, const QkvStep& s, const RopeTable& rope,
                            const std::vector<AppendSlot>& slots, const GraphTable* table) {
  const int64_t B = static_cast<int64_t>(slots.size()), qn = s.q_heads * s.head_dim, kn = s.kv_heads * s.head_dim;
  if (B == 0 || (cuda::capturing() && !table) || y.device() != Device::CUDA ||
      (y.dtype() != DType::BF16 && y.dtype() != DType::F32))
    return Tensor();
  LATHE_CHECK(y.ndim() == 2 && y.dim(0) == B && y.dim(1) == qn + 2 * kn && y.is_contiguous(),
              "qkv_rope_append_rows: expects one contiguous row of q|k|v heads per slot");
  std::vector<cuda::AppendRow> host(slots.size());
  for (size_t r = 0; r < slots.size(); ++r) {
    const AppendSlot& sl = slots[r];
    LATHE_CHECK(sl.keys && sl.values && sl.keys->device() == Device::CUDA && sl.keys->ndim() == 3 &&
                    sl.keys->dim(1) == s.kv_heads && sl.keys->dim(2) == s.head_dim &&
                    sl.values->shape() == sl.keys->shape() && sl.keys->dtype() == y.dtype() &&
                    sl.values->dtype() == y.dtype() && sl.keys->is_contiguous() && sl.values->is_contiguous() &&
                    sl.row >= 0 && sl.row < sl.keys->dim(0),
                "qkv_rope_append_rows: cache buffers do not match the heads");
    host[r] = {sl.keys->raw(), sl.values->raw(), sl.row, sl.pos};
  }
  const size_t bytes = host.size() * sizeof(cuda::AppendRow);
  Tensor dev;
  const void* rows_dev = row_table(host.data(), bytes, table, dev);
  Tensor q = Tensor::empty({B, s.q_heads, s.head_dim}, y.dtype(), Device::CUDA);
  const float* qw = s.norm ? f32_ptr(&s.q_w, "qkv_rope_append") : nullptr;
  const float* kw = s.norm ? f32_ptr(&s.k_w, "qkv_rope_append") : nullptr;
  cuda::qkv_rope_append_rows(y.raw(), q.raw(), static_cast<const cuda::AppendRow*>(rows_dev), B, y.dtype(), s.q_heads,
                             s.kv_heads, s.head_dim, s.norm, qw, kw, s.eps, s.plus_one, rope.inv_freq.data(), rope.dims,
                             rope.attention_scaling);
  return q;
}

bool quantized_append_covers(int64_t head_dim, int bits, int group_size) {
  return cuda::qkv_rope_append_quantized_covers(head_dim, bits, group_size);
}

Tensor qkv_rope_append_quantized_rows(const Tensor& y, const QkvStep& s, const RopeTable& rope,
                                      const std::vector<QuantAppendSlot>& slots, int bits, int group_size,
                                      const GraphTable* table) {
  const int64_t B = static_cast<int64_t>(slots.size()), qn = s.q_heads * s.head_dim, kn = s.kv_heads * s.head_dim;
  if (B == 0 || (cuda::capturing() && !table) || y.device() != Device::CUDA ||
      (y.dtype() != DType::BF16 && y.dtype() != DType::F32) || 2 * (rope.dims / 2) > s.head_dim ||
      rope.dims / 2 > 256 || !cuda::qkv_rope_append_quantized_covers(s.head_dim, bits, group_size))
    return Tensor();
  LATHE_CHECK(y.ndim() == 2 && y.dim(0) == B && y.dim(1) == qn + 2 * kn && y.is_contiguous(),
              "qkv_rope_append_quantized_rows: expects one contiguous row of q|k|v heads per slot");
  std::vector<cuda::QuantAppendRow> host(slots.size());
  for (size_t r = 0; r < slots.size(); ++r) {
    for (size_t i = 0; i < 6; ++i) {
      LATHE_CHECK(slots[r].dst[i], "qkv_rope_append_quantized_rows: a row without a destination");
      host[r].dst[i] = slots[r].dst[i];
    }
    host[r].pos0 = slots[r].pos;
  }
  const size_t bytes = host.size() * sizeof(cuda::QuantAppendRow);
  Tensor dev;
  const void* rows_dev = row_table(host.data(), bytes, table, dev);
  Tensor q = Tensor::empty({B, s.q_heads, s.head_dim}, y.dtype(), Device::CUDA);
  const float* qw = s.norm ? f32_ptr(&s.q_w, "qkv_rope_append") : nullptr;
  const float* kw = s.norm ? f32_ptr(&s.k_w, "qkv_rope_append") : nullptr;
  cuda::qkv_rope_append_quantized_rows(y.raw(), q.raw(), static_cast<const cuda::QuantAppendRow*>(rows_dev), B,
                                       y.dtype(), s.q_heads, s.kv_heads, s.head_dim, bits, group_size, s.norm, qw, kw,
                                       s.eps, s.plus_one, rope.inv_freq.data(), rope.dims, rope.attention_scaling);
  return q;
}

}  // namespace lathe::gpu
#endif
