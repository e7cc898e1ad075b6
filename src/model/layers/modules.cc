#include "model/layers/modules.h"

#include "common/error.h"

namespace lathe {

Linear bind_linear(WeightBinder& b, const std::string& module, int64_t out, int64_t in, bool with_bias) {
  Linear l;
  l.w = b.linear(module, out, in);
  if (with_bias) l.bias = b.tensor(module + ".bias", {out});
  l.lora_site = b.lora_site(module, out, in);
  return l;
}

Linear bind_row_slice(WeightBinder& b, const Weight& stacked, const std::string& module, int64_t begin, int64_t end) {
  Linear l;
  l.w = WeightBinder::row_slice(stacked, begin, end);
  l.lora_site = b.lora_site(module, end - begin, stacked.in_features());
  return l;
}

std::vector<Tensor> apply_linears(const Tensor& x, std::initializer_list<const Linear*> ls, bool f32_out) {
  std::vector<Tensor> ys;
  ys.reserve(ls.size());
  if (x.device() != Device::CPU) {
    for (const Linear* l : ls) ys.push_back((*l)(x, f32_out));
    return ys;
  }
  // Each Linear's operator() in three passes: the residuals begun, the matmuls (one shared quantization of x),
  // the residuals added to their own outputs. (A device keeps operator()'s order per Linear, above: a begun
  // shrink may run on a side stream that its own finish joins.)
  std::vector<const Weight*> ws;
  std::vector<const Tensor*> biases;
  std::vector<lora::PendingResidual> pending;
  for (const Linear* l : ls) {
    ws.push_back(&l->w);
    biases.push_back(l->bias.defined() ? &l->bias : nullptr);
    pending.push_back(l->lora_site >= 0 ? lora::begin_residual(lora::site_group(l->lora_site, l->w.out_features()), x)
                                        : lora::PendingResidual{});
  }
  ys = linear_many(x, ws, biases, f32_out);
  size_t i = 0;
  for (const Linear* l : ls) {
    if (l->lora_site >= 0) lora::finish_residual(pending[i], x, ys[i]);
    ++i;
  }
  return ys;
}

Activation parse_activation(const std::string& name) {
  if (name == "silu" || name == "swish") return Activation::SiLU;
  if (name == "gelu_pytorch_tanh" || name == "gelu_tanh" || name == "gelu_new" || name == "gelu_approx")
    return Activation::GeluTanh;
  throw Error(ErrorKind::Unsupported, "activation '" + name + "' is not supported (silu, gelu_pytorch_tanh)");
}

// Gate and up stay in x's type: F32 there (measured on the bf16 fixtures) moved the argmax agreement only
// within its noise and cost an extra conversion kernel per layer (~3% prefill).
Tensor GatedMLP::operator()(const Tensor& x, bool f32_out) const {
  Tensor g, u;
  // One token, or any rows on a device: one matmul over the stacked gate|up (a device's gated kernel reads the
  // two column halves in place; a 64-row Qwen3-4B decode step makes 36 cuBLAS calls fewer). CPU prefill: a GEMM
  // per row view (contiguous outputs) over one shared quantization of x. LoRA residuals on gate or up are added to the
  // fused output on the device (gathered kernels), else the per-module route's Linears add them.
  const int64_t I = gate.w.out_features();
  const LoraGroup lg = stacked_lora_group({&gate, &up});
  if (fused && (x.dim(0) == 1 || x.device() != Device::CPU) && lora::group_fusable(lg, x)) {
    const lora::PendingResidual r = lora::begin_residual(lg, x);
    Tensor gu = linear(x, gate_up);
    lora::finish_residual(r, x, gu);
    g = gu.slice(1, 0, I);
    u = gu.slice(1, I, 2 * I);
  } else {
    std::vector<Tensor> gu = apply_linears(x, {&gate, &up});
    g = std::move(gu[0]);
    u = std::move(gu[1]);
  }
  // The default CPU path (weights packed for the int8 kernels) also takes the polynomial exp; --exact keeps libm's.
  const bool fast_exp = down.w.quantized && down.w.q.cpu_packed;
  return down(act == Activation::SiLU ? silu_mul(g, u, fast_exp) : gelu_tanh_mul(g, u), f32_out);
}

LoraGroup stacked_lora_group(std::initializer_list<const Linear*> parts) {
  LoraGroup g;
  int64_t col = 0;
  for (const Linear* l : parts) {
    const int64_t n = l->w.out_features();
    if (l->lora_site >= 0) {
      g.site[g.n] = l->lora_site;
      g.col0[g.n] = col;
      g.cols[g.n] = n;
      ++g.n;
    }
    col += n;
  }
  return g;
}

GatedMLP bind_gated_mlp(WeightBinder& b, const std::string& prefix, int64_t hidden, int64_t inter, Activation act,
                        bool bias) {
  GatedMLP m;
  const std::string g = prefix + ".gate_proj", u = prefix + ".up_proj";
  if (auto f = bias ? std::nullopt : b.fused_linear({g, u}, {inter, inter}, hidden)) {
    m.fused = true;
    m.gate_up = *f;
    m.gate = bind_row_slice(b, *f, g, 0, inter);
    m.up = bind_row_slice(b, *f, u, inter, 2 * inter);
  } else {
    m.gate = bind_linear(b, g, inter, hidden, bias);
    m.up = bind_linear(b, u, inter, hidden, bias);
  }
  m.down = bind_linear(b, prefix + ".down_proj", hidden, inter, bias);
  m.act = act;
  return m;
}

}  // namespace lathe
