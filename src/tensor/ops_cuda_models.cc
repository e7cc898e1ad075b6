// Device dispatch for the ops of the newer model families (Gated DeltaNet, MoE, gated attention) and of the
// quantized KV caches: shape checks, output allocation, kernel launch (tensor/cuda/kernels_models.h).
#ifdef LATHE_HAVE_CUDA
#include "common/error.h"
#include "tensor/cuda/kernels_models.h"
#include "tensor/ops_cuda.h"
#include "tensor/ops_cuda_check.h"

namespace lathe::gpu {
namespace {

void require_f32_device(const Tensor& t, const char* op) {
  if (t.device() != Device::CUDA || t.dtype() != DType::F32 || !t.is_contiguous())
    throw Error(ErrorKind::InvalidArgument,
                std::string(op) + ": expects a contiguous F32 device tensor, got " + t.describe());
}

Tensor upload_i32(const std::vector<int32_t>& v) {
  return Tensor::from_ints(v, {static_cast<int64_t>(v.size())}).to(Device::CUDA);
}

}  // namespace

Tensor convert(const Tensor& x_in, DType t) {
  require_act(x_in, "convert");
  const Tensor x = x_in.contiguous();
  Tensor out = Tensor::empty(x.shape(), t, Device::CUDA);
  cuda::convert(x.raw(), x.dtype(), out.raw(), t, x.numel());
  return out;
}

Tensor sigmoid_mul(const Tensor& x_in, const Tensor& gate_in) {
  require_act(x_in, "sigmoid_mul");
  LATHE_CHECK(gate_in.dtype() == x_in.dtype(), "sigmoid_mul: types differ");
  const Tensor x = x_in.contiguous(), g = gate_in.contiguous();
  Tensor out = Tensor::empty(x.shape(), x.dtype(), Device::CUDA);
  cuda::sigmoid_mul(x.raw(), g.raw(), out.raw(), x.dtype(), x.numel());
  return out;
}

Tensor l2_normalize(const Tensor& x_in, float eps) {
  require_act(x_in, "l2_normalize");
  const Tensor x = x_in.contiguous();
  Tensor out = Tensor::empty(x.shape(), x.dtype(), Device::CUDA);
  const int64_t D = x.dim(-1);
  cuda::l2_normalize(x.raw(), x.dtype(), out.raw(), x.numel() / D, D, eps);
  return out;
}

Tensor rms_norm_gated(const Tensor& x_in, const Tensor& z_in, const Tensor& weight, float eps) {
  require_act(x_in, "rms_norm_gated");
  require_act(z_in, "rms_norm_gated");
  const Tensor x = x_in.contiguous(), z = z_in.contiguous();
  Tensor out = Tensor::empty(x.shape(), z.dtype(), Device::CUDA);
  const int64_t D = x.dim(-1);
  cuda::rms_norm_gated(x.raw(), x.dtype(), z.raw(), z.dtype(), f32_ptr(&weight, "rms_norm_gated"), out.raw(), z.dtype(),
                       x.numel() / D, D, eps);
  return out;
}

Tensor causal_conv1d_silu(const Tensor& x_in, const Tensor& weight, Tensor& state) {
  require_act(x_in, "causal_conv1d");
  require_f32_device(weight, "causal_conv1d weight");
  require_f32_device(state, "causal_conv1d state");
  const Tensor x = x_in.contiguous();
  Tensor out = Tensor::empty(x.shape(), DType::F32, Device::CUDA);
  cuda::causal_conv1d_silu(x.raw(), x.dtype(), weight.data<float>(), state.data<float>(), out.data<float>(), x.dim(0),
                           x.dim(1), static_cast<int>(weight.dim(1)));
  return out;
}

Tensor gated_delta_rule(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const Tensor& g_in,
                        const Tensor& beta_in, Tensor& state) {
  const Tensor q = gpu::convert(q_in, DType::F32).contiguous(), k = gpu::convert(k_in, DType::F32).contiguous(),
               v = gpu::convert(v_in, DType::F32).contiguous(), g = g_in.contiguous(), beta = beta_in.contiguous();
  for (const Tensor* t : {&q, &k, &v, &g, &beta}) require_f32_device(*t, "gated_delta_rule");
  require_f32_device(state, "gated_delta_rule state");
  Tensor out = Tensor::empty(v.shape(), DType::F32, Device::CUDA);
  cuda::gated_delta_rule(q.data<float>(), k.data<float>(), v.data<float>(), g.data<float>(), beta.data<float>(),
                         state.data<float>(), out.data<float>(), q.dim(0), q.dim(1), v.dim(1), q.dim(2), v.dim(2));
  return out;
}

void delta_gates(const Tensor& a_in, const Tensor& b_in, const Tensor& neg_a, const Tensor& dt_bias, Tensor& g,
                 Tensor& beta) {
  require_act(a_in, "delta_gates");
  LATHE_CHECK(b_in.dtype() == a_in.dtype(), "delta_gates: types differ");
  const Tensor a = a_in.contiguous(), b = b_in.contiguous();
  g = Tensor::empty(a.shape(), DType::F32, Device::CUDA);
  beta = Tensor::empty(a.shape(), DType::F32, Device::CUDA);
  cuda::delta_gates(a.raw(), b.raw(), a.dtype(), f32_ptr(&neg_a, "delta_gates"), f32_ptr(&dt_bias, "delta_gates"),
                    g.data<float>(), beta.data<float>(), a.dim(0), a.dim(1));
}

void router_topk(const Tensor& scores_in, const Tensor& expert_scale, int64_t k, Tensor& idx, Tensor& weights) {
  const Tensor scores = scores_in.contiguous();
  require_f32_device(scores, "router_topk");
  const int64_t T = scores.dim(0);
  idx = Tensor::empty({T, k}, DType::I32, Device::CUDA);
  weights = Tensor::empty({T, k}, DType::F32, Device::CUDA);
  cuda::router_topk(scores.data<float>(), f32_ptr(&expert_scale, "router_topk"), T, scores.dim(1), k,
                    idx.data<int32_t>(), weights.data<float>());
}

Tensor gather_rows(const Tensor& x_in, const std::vector<int32_t>& idx) {
  const Tensor x = x_in.contiguous();
  const int64_t D = x.numel() / std::max<int64_t>(x.dim(0), 1);
  const size_t row = static_cast<size_t>(D) * dtype_size(x.dtype());
  LATHE_CHECK(row % 4 == 0, "gather_rows: row size must be a multiple of 4 bytes");
  for (int32_t i : idx) LATHE_CHECK(i >= 0 && i < x.dim(0), "gather_rows: index out of range");
  Tensor out = Tensor::empty({static_cast<int64_t>(idx.size()), D}, x.dtype(), Device::CUDA);
  const Tensor dev_idx = upload_i32(idx);
  cuda::gather_rows(x.raw(), dev_idx.data<int32_t>(), static_cast<int64_t>(idx.size()), row, out.raw());
  return out;
}

void scatter_add_rows(Tensor& out, const std::vector<int32_t>& idx, const Tensor& x_in, const std::vector<float>& w) {
  require_f32_device(out, "scatter_add_rows");
  require_act(x_in, "scatter_add_rows");
  const Tensor x = x_in.contiguous();
  LATHE_CHECK(out.ndim() == 2 && x.ndim() == 2 && x.dim(1) == out.dim(1) &&
                  x.dim(0) == static_cast<int64_t>(idx.size()) && w.size() == idx.size(),
              "scatter_add_rows: shapes");
  for (int32_t i : idx) LATHE_CHECK(i >= 0 && i < out.dim(0), "scatter_add_rows: index out of range");
  const Tensor dev_idx = upload_i32(idx);
  const Tensor dev_w = Tensor::from_floats(w, {static_cast<int64_t>(w.size())}).to(Device::CUDA);
  cuda::scatter_add_rows(out.data<float>(), out.dim(1), dev_idx.data<int32_t>(), x.raw(), x.dtype(),
                         dev_w.data<float>(), x.dim(0));
}

QuantizedMatrix quantize_kv(const Tensor& x_in, int bits, int group_size) {
  require_act(x_in, "quantize_kv");
  const Tensor x = x_in.contiguous();
  const int64_t rows = x.dim(0), cols = x.dim(1);
  QuantizedMatrix q;
  q.bits = bits;
  q.group_size = group_size;
  q.w = Tensor::empty({rows, cols * bits / 32}, DType::U32, Device::CUDA);
  q.scales = Tensor::empty({rows, cols / group_size}, x.dtype(), Device::CUDA);
  q.biases = Tensor::empty({rows, cols / group_size}, x.dtype(), Device::CUDA);
  cuda::quantize_rows(x.raw(), x.dtype(), rows, cols, bits, group_size, q.w.data<uint32_t>(), q.scales.raw(),
                      q.biases.raw(), x.dtype());
  return q;
}

}  // namespace lathe::gpu
#endif
