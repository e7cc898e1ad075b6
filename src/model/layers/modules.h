// Small building blocks shared by architectures: a linear layer with optional bias, RMSNorm, gated MLP.
#pragma once
#include <string>

#include "model/weights.h"
#include "tensor/ops.h"

namespace lathe {

struct Linear {
  Weight w;
  Tensor bias;
  Tensor operator()(const Tensor& x) const { return linear(x, w, bias.defined() ? &bias : nullptr); }
};

// Binds module.weight [out, in] (dense or quantized) and, when with_bias, module.bias [out].
Linear bind_linear(WeightBinder& b, const std::string& module, int64_t out, int64_t in, bool with_bias = false);

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
