// Mixture-of-experts feed-forward (Gemma 4): a router picks top-k of E experts per token, each expert is a
// GeGLU/SwiGLU MLP stored as stacked 3-D weights (dense or MLX-quantized), outputs summed with the router
// weights. Weight layouts: HF `experts.gate_up_proj` [E, 2I, H] + `experts.down_proj` [E, H, I], or mlx-lm
// `experts.switch_glu.{gate,up,down}_proj`.
#pragma once
#include <string>
#include <vector>

#include "model/layers/modules.h"

namespace lathe {

// Gemma 4 router: weightless RMSNorm, × scale · hidden^-½, projection to E scores, softmax, top-k,
// renormalised over the k, × per_expert_scale[expert].
struct Router {
  Tensor norm_weight;  // scale · hidden^-½, folded once at load
  Tensor per_expert_scale;
  Linear proj;
  int64_t experts = 0, top_k = 0;
  float eps = 1e-6f;
  // For x [T, H] (the F32 residual): idx/weights [T·k] (token t's picks at t·k .. t·k + k − 1). `act` is the
  // matmul input type (BF16 on CUDA in bf16 runs); scores, softmax and top-k are f32 on x's device, and only the
  // T·k picks come back to the host (the experts are grouped there).
  void route(const Tensor& x, DType act, std::vector<int32_t>& idx, std::vector<float>& weights) const;
};
Router bind_router(WeightBinder& b, const std::string& prefix, int64_t hidden, int64_t experts, int64_t top_k,
                   float eps);

struct Experts {
  std::vector<Weight> gate_up;  // fused [2I, H] per expert (gate rows first), or empty when split
  std::vector<Weight> gate, up, down;
  int64_t inter = 0;
  Activation act = Activation::GeluTanh;
  // x [T, H] through the experts picked by route(); returns F32 [T, H] on x's device.
  Tensor operator()(const Tensor& x, const std::vector<int32_t>& idx, const std::vector<float>& weights,
                    int64_t top_k) const;
};
Experts bind_experts(WeightBinder& b, const std::string& prefix, int64_t experts, int64_t hidden, int64_t inter,
                     Activation act);

}  // namespace lathe
