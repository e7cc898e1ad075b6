// Small building blocks shared by architectures: a linear layer with optional bias, RMSNorm, gated MLP.
#pragma once
#include <initializer_list>
#include <string>
#include <vector>

#include "lora/forward_context.h"
#include "model/weights.h"
#include "tensor/ops.h"

namespace lathe {

// y = x·Wᵀ (+ bias), then the LoRA residuals of the current forward's adapters at this layer ([lora]: none
// installed = the base model; see lora/forward_context.h). The base weight is never dequantized for it.
struct Linear {
  Weight w;
  Tensor bias;
  int lora_site = -1;  // index in the model's LinearSites; -1 = not adaptable
  Tensor operator()(const Tensor& x, bool f32_out = false) const {
    if (lora_site < 0) return linear(x, w, bias.defined() ? &bias : nullptr, f32_out);
    const lora::PendingResidual r = lora::begin_residual(lora::site_group(lora_site, w.out_features()), x);
    Tensor y = linear(x, w, bias.defined() ? &bias : nullptr, f32_out);
    lora::finish_residual(r, x, y);
    return y;
  }
};

// Each Linear of ls over the same x, as its operator() would give it (bias, LoRA residual), in order. On the CPU
// x is quantized once for all of them (linear_many); a device runs them one by one.
std::vector<Tensor> apply_linears(const Tensor& x, std::initializer_list<const Linear*> ls, bool f32_out = false);

// The LoRA group of Linears whose outputs sit side by side in one stacked projection (q|k|v, gate|up), in
// that order: each adaptable one's site over its columns.
LoraGroup stacked_lora_group(std::initializer_list<const Linear*> parts);

// Binds module.weight [out, in] (dense or quantized) and, when with_bias, module.bias [out].
Linear bind_linear(WeightBinder& b, const std::string& module, int64_t out, int64_t in, bool with_bias = false);
// Rows [begin, end) of a stacked weight as the Linear of `module` (its part of a fused q|k|v or gate|up).
Linear bind_row_slice(WeightBinder& b, const Weight& stacked, const std::string& module, int64_t begin, int64_t end);

struct RMSNorm {
  Tensor weight;  // undefined = weightless
  float eps = 1e-6f;
  bool plus_one = false;
  Tensor operator()(const Tensor& x) const { return rms_norm(x, weight, eps, plus_one); }
};

enum class Activation { SiLU, GeluTanh };
// From hidden_act / hidden_activation; throws Unsupported for anything else.
Activation parse_activation(const std::string& name);

struct GatedMLP {
  Linear gate, up, down;
  Weight gate_up;  // on a device: gate and up stacked (one GEMV); gate/up are then row views of it
  bool fused = false;
  Activation act = Activation::SiLU;
  // f32_out: down_proj emits F32 whatever the activation type (for an F32 residual add without rounding).
  Tensor operator()(const Tensor& x, bool f32_out = false) const;
};
GatedMLP bind_gated_mlp(WeightBinder& b, const std::string& prefix, int64_t hidden, int64_t inter, Activation act,
                        bool bias = false);

}  // namespace lathe
