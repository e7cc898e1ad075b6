#include "model/layers/moe.h"

#include <cmath>

#include "common/error.h"
#include "tensor/ops_extra.h"

namespace lathe {

Router bind_router(WeightBinder& b, const std::string& p, int64_t hidden, int64_t experts, int64_t top_k, float eps) {
  Router r;
  r.experts = experts;
  r.top_k = top_k;
  r.eps = eps;
  if (top_k <= 0 || top_k > experts)
    throw Error(ErrorKind::Corrupt, "config.json: top_k_experts " + std::to_string(top_k) + " does not fit " +
                                        std::to_string(experts) + " experts");
  std::vector<float> w = b.tensor(p + ".scale", {hidden}).to_floats();
  const float root = 1.0f / std::sqrt(static_cast<float>(hidden));
  for (float& v : w) v *= root;
  r.per_expert_scale = b.tensor(p + ".per_expert_scale", {experts});
  r.norm_weight = Tensor::from_floats(w, {hidden}).to(r.per_expert_scale.device());
  r.proj = bind_linear(b, p + ".proj", experts, hidden);
  return r;
}

void Router::route(const Tensor& x, DType act, std::vector<int32_t>& idx, std::vector<float>& weights) const {
  const Tensor scores = linear(rms_norm(x, norm_weight, eps, false, act), proj.w, nullptr, /*f32_out=*/true);
  Tensor picks, picked_weights;
  router_topk(scores, per_expert_scale, top_k, picks, picked_weights);
  const Tensor host_idx = picks.to(Device::CPU);
  idx.assign(host_idx.data<int32_t>(), host_idx.data<int32_t>() + host_idx.numel());
  weights = picked_weights.to_floats();
}

Experts bind_experts(WeightBinder& b, const std::string& p, int64_t experts, int64_t hidden, int64_t inter,
                     Activation act) {
  Experts x;
  x.inter = inter;
  x.act = act;
  const std::string fused = p + ".gate_up_proj";
  if (b.has(fused) || b.has(fused + ".weight")) {
    x.gate_up = b.stacked_linear(fused, experts, 2 * inter, hidden);
    x.down = b.stacked_linear(p + ".down_proj", experts, hidden, inter);
  } else {
    const std::string s = p + ".switch_glu";
    x.gate = b.stacked_linear(s + ".gate_proj", experts, inter, hidden);
    x.up = b.stacked_linear(s + ".up_proj", experts, inter, hidden);
    x.down = b.stacked_linear(s + ".down_proj", experts, hidden, inter);
  }
  return x;
}

Tensor Experts::operator()(const Tensor& x, const std::vector<int32_t>& idx, const std::vector<float>& weights,
                           int64_t top_k) const {
  const int64_t T = x.dim(0), E = static_cast<int64_t>(down.size());
  Tensor out = Tensor::zeros({T, x.dim(1)}, DType::F32, x.device());
  // Group the (token, pick) pairs by expert so each expert runs once over its tokens.
  std::vector<std::vector<int32_t>> tokens(static_cast<size_t>(E));
  std::vector<std::vector<float>> scale(static_cast<size_t>(E));
  for (size_t i = 0; i < idx.size(); ++i) {
    tokens[static_cast<size_t>(idx[i])].push_back(static_cast<int32_t>(static_cast<int64_t>(i) / top_k));
    scale[static_cast<size_t>(idx[i])].push_back(weights[i]);
  }
  for (int64_t e = 0; e < E; ++e) {
    const auto& toks = tokens[static_cast<size_t>(e)];
    if (toks.empty()) continue;
    const Tensor xe = gather_rows(x, toks);
    Tensor g, u;
    if (!gate_up.empty()) {
      const Tensor gu = linear(xe, gate_up[static_cast<size_t>(e)]);
      g = gu.slice(1, 0, inter);
      u = gu.slice(1, inter, 2 * inter);
    } else {
      g = linear(xe, gate[static_cast<size_t>(e)]);
      u = linear(xe, up[static_cast<size_t>(e)]);
    }
    const Tensor h = act == Activation::SiLU ? silu_mul(g, u) : gelu_tanh_mul(g, u);
    scatter_add_rows(out, toks, linear(h, down[static_cast<size_t>(e)]), scale[static_cast<size_t>(e)]);
  }
  return out;
}

}  // namespace lathe
