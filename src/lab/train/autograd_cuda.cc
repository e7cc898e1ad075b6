// Nodes and the pointwise / normalisation / rotary / attention ops of the CUDA training autograd (the linear ops,
// LoRA and the loss head are in autograd_cuda_linear.cc). Each backward closure adds into its inputs' grads from
// its output's; an output nothing flowed into contributes nothing.
#ifdef LATHE_HAVE_CUDA
#include "lab/train/autograd_cuda.h"

#include <cmath>

#include "common/error.h"
#include "tensor/cuda/train_kernels.h"

namespace lathe::train::dg {
namespace tk = lathe::cuda::train;

float* Node::g() {
  if (!grad.defined()) grad = Tensor::zeros({rows, cols}, DType::F32, Device::CUDA);
  return grad.data<float>();
}

Var make_var(int64_t rows, int64_t cols, bool requires_grad) {
  auto n = std::make_shared<Node>();
  n->rows = rows;
  n->cols = cols;
  n->value = Tensor::empty({rows, cols}, DType::F32, Device::CUDA);
  n->requires_grad = requires_grad;
  return n;
}

Var leaf(const Tensor& value, bool requires_grad) {
  LATHE_CHECK(
      value.device() == Device::CUDA && value.dtype() == DType::F32 && value.ndim() == 2 && value.is_contiguous(),
      "dg::leaf: expects a contiguous F32 [rows, cols] device tensor");
  auto n = std::make_shared<Node>();
  n->rows = value.dim(0);
  n->cols = value.dim(1);
  n->value = value;
  n->requires_grad = requires_grad;
  return n;
}

Var from_host(const std::vector<float>& values, int64_t rows, int64_t cols, bool requires_grad) {
  LATHE_CHECK(static_cast<int64_t>(values.size()) == rows * cols, "dg::from_host: size mismatch");
  return leaf(Tensor::from_floats(values, {rows, cols}).to(Device::CUDA), requires_grad);
}

std::vector<float> to_host(const Tensor& t) { return t.to_floats(); }

void seed_grad(const Var& y, float v) { tk::fill(y->g(), y->numel(), v); }

Var embedding(Tape&, const std::vector<int32_t>& ids, const Weight& table) {
  Tensor rows = lathe::embedding(ids, table, DType::F32);  // F32 [n, dim] on the table's device
  if (rows.device() != Device::CUDA) rows = rows.to(Device::CUDA);
  return leaf(rows.contiguous(), false);
}

Var add(Tape& t, const Var& a, const Var& b) {
  LATHE_CHECK(a->rows == b->rows && a->cols == b->cols, "dg::add: shape mismatch");
  Var y = make_var(a->rows, a->cols, a->requires_grad || b->requires_grad);
  tk::add(a->v(), b->v(), y->mv(), y->numel());
  if (y->requires_grad)
    t.record([a, b, y] {
      const float* gy = y->gy();
      if (!gy) return;
      for (const Var& in : {a, b})
        if (in->requires_grad) tk::axpy(in->g(), gy, y->numel(), 1.0f);
    });
  return y;
}

Var scale(Tape& t, const Var& x, float s) {
  Var y = make_var(x->rows, x->cols, x->requires_grad);
  tk::scale(x->v(), y->mv(), y->numel(), s);
  if (y->requires_grad)
    t.record([x, y, s] {
      if (const float* gy = y->gy()) tk::axpy(x->g(), gy, y->numel(), s);
    });
  return y;
}

Var rms_norm(Tape& t, const Var& x, const Tensor& weight, float eps, bool plus_one, int64_t group) {
  LATHE_CHECK(group > 0 && x->cols % group == 0, "dg::rms_norm: group does not divide the row");
  const float* w = nullptr;
  if (weight.defined()) {
    LATHE_CHECK(weight.device() == Device::CUDA && weight.dtype() == DType::F32 && weight.numel() == group &&
                    weight.is_contiguous(),
                "dg::rms_norm: the weight must be F32 [group] on the device");
    w = weight.data<float>();
  }
  const int64_t groups = x->rows * (x->cols / group);
  Var y = make_var(x->rows, x->cols, x->requires_grad);
  Tensor inv = Tensor::empty({groups}, DType::F32, Device::CUDA);
  tk::rms_norm(x->v(), w, plus_one, eps, groups, group, y->mv(), inv.data<float>());
  if (y->requires_grad)
    t.record([x, y, inv, weight, w, plus_one, groups, group] {
      if (const float* gy = y->gy())
        tk::rms_norm_backward(x->v(), w, plus_one, inv.data<float>(), gy, groups, group, x->g());
    });
  return y;
}

Tensor rope_table(const RopeTable& table, const std::vector<int64_t>& positions) {
  const int64_t T = static_cast<int64_t>(positions.size()), half = table.dims / 2;
  std::vector<float> cs(static_cast<size_t>(T * half * 2));
  for (int64_t r = 0; r < T; ++r) {
    const float pos = static_cast<float>(positions[static_cast<size_t>(r)]);
    for (int64_t i = 0; i < half; ++i) {
      const float angle = pos * table.inv_freq[static_cast<size_t>(i)];
      cs[static_cast<size_t>((r * half + i) * 2)] = std::cos(angle) * table.attention_scaling;
      cs[static_cast<size_t>((r * half + i) * 2 + 1)] = std::sin(angle) * table.attention_scaling;
    }
  }
  return Tensor::from_floats(cs, {T, std::max<int64_t>(half, 1) * 2}).to(Device::CUDA);
}

Var rope(Tape& t, const Var& x, const Tensor& cos_sin, int64_t head_dim) {
  LATHE_CHECK(x->cols % head_dim == 0 && cos_sin.dim(0) == x->rows, "dg::rope: shapes");
  const int64_t T = x->rows, H = x->cols / head_dim, half = cos_sin.dim(1) / 2;
  LATHE_CHECK(2 * half <= head_dim, "dg::rope: the rotary dims exceed the head");
  Var y = make_var(x->rows, x->cols, x->requires_grad);
  tk::rope(x->v(), cos_sin.data<float>(), T, H, head_dim, half, y->mv());
  if (y->requires_grad)
    t.record([x, y, cos_sin, T, H, head_dim, half] {
      if (const float* gy = y->gy()) tk::rope_backward(gy, cos_sin.data<float>(), T, H, head_dim, half, x->g());
    });
  return y;
}

namespace {
AttentionPath g_attention_path = AttentionPath::Auto;
}

void set_attention_path(AttentionPath p) { g_attention_path = p; }

Var attention(Tape& t, const Var& q, const Var& k, const Var& v, const AttnShape& s) {
  LATHE_CHECK(s.heads > 0 && s.kv_heads > 0 && s.heads % s.kv_heads == 0, "dg::attention: heads");
  const int64_t T = q->rows;
  LATHE_CHECK(q->cols == s.heads * s.head_dim && k->cols == s.kv_heads * s.head_dim && v->cols == k->cols &&
                  k->rows == T && v->rows == T,
              "dg::attention: shapes");
  if (s.segment_start.defined())
    LATHE_CHECK(s.segment_start.device() == Device::CUDA && s.segment_start.dtype() == DType::I64 &&
                    s.segment_start.numel() == T,
                "dg::attention: segment starts must be I64 [T] on the device");
  tk::AttnArgs a;
  a.q = q->v();
  a.k = k->v();
  a.v = v->v();
  a.T = T;
  a.Hq = s.heads;
  a.Hkv = s.kv_heads;
  a.D = s.head_dim;
  a.qc = q->cols;
  a.kc = k->cols;
  a.scale = s.scale;
  a.softcap = s.softcap;
  a.window = s.window;
  a.seg = s.segment_start.defined() ? s.segment_start.data<int64_t>() : nullptr;
  Var y = make_var(T, q->cols, q->requires_grad || k->requires_grad || v->requires_grad);
  Tensor lse = Tensor::empty({s.heads * T}, DType::F32, Device::CUDA);
  const bool gemm =
      g_attention_path == AttentionPath::Gemm || (g_attention_path == AttentionPath::Auto && T >= kGemmAttentionRows);
  if (gemm) {
    Tensor scores = Tensor::empty({tk::attention_gemm_scratch(a)}, DType::F32, Device::CUDA);
    tk::attention_gemm(a, y->mv(), lse.data<float>(), scores.data<float>());
  } else {
    tk::attention(a, y->mv(), lse.data<float>());
  }
  if (y->requires_grad)
    t.record([q, k, v, y, lse, a, gemm, seg = s.segment_start] {
      const float* gy = y->gy();
      if (!gy) return;
      if (gemm) {
        const int64_t n = tk::attention_gemm_scratch(a);
        Tensor s1 = Tensor::empty({n}, DType::F32, Device::CUDA), s2 = Tensor::empty({n}, DType::F32, Device::CUDA);
        tk::attention_gemm_backward(a, lse.data<float>(), gy, s1.data<float>(), s2.data<float>(), q->g(), k->g(),
                                    v->g());
        return;
      }
      Tensor delta = Tensor::empty({a.Hq * a.T}, DType::F32, Device::CUDA);
      tk::attention_backward(a, y->v(), lse.data<float>(), gy, delta.data<float>(), q->g(), k->g(), v->g());
    });
  return y;
}

Var gated(Tape& t, const Var& gate, const Var& up, Gate act) {
  LATHE_CHECK(gate->rows == up->rows && gate->cols == up->cols, "dg::gated: shape mismatch");
  const bool gelu = act == Gate::GeluTanh;
  Var y = make_var(gate->rows, gate->cols, gate->requires_grad || up->requires_grad);
  tk::gated(gate->v(), up->v(), y->mv(), y->numel(), gelu);
  if (y->requires_grad)
    t.record([gate, up, y, gelu] {
      if (const float* gy = y->gy())
        tk::gated_backward(gate->v(), up->v(), gy, gate->requires_grad ? gate->g() : nullptr,
                           up->requires_grad ? up->g() : nullptr, y->numel(), gelu);
    });
  return y;
}

Var masked(Tape& t, const Var& x, const Tensor& mask) {
  LATHE_CHECK(mask.device() == Device::CUDA && mask.dtype() == DType::F32 && mask.numel() == x->numel(),
              "dg::masked: the mask must be F32 on the device and cover the input");
  Var y = make_var(x->rows, x->cols, x->requires_grad);
  tk::mul(x->v(), mask.data<float>(), y->mv(), y->numel());
  if (y->requires_grad)
    t.record([x, y, mask] {
      if (const float* gy = y->gy()) tk::mul_add(x->g(), gy, mask.data<float>(), y->numel());
    });
  return y;
}

}  // namespace lathe::train::dg
#endif
