// Gated DeltaNet token mixer (Qwen3.5 / Qwen3-Next "linear attention"): in_proj_qkv → depthwise causal conv1d
// (carried window) → SiLU → q|k|v heads; q, k L2-normalised (q × Dk^-½); decay g = −exp(A_log)·softplus(a +
// dt_bias) and beta = sigmoid(b) per value head; the delta-rule recurrence over an f32 state; gated RMSNorm
// with silu(in_proj_z); out_proj. State lives in an SSMCache.
#pragma once
#include <string>

#include "cache/ssm_cache.h"
#include "model/batch_rows.h"
#include "model/layers/modules.h"

namespace lathe {

struct GatedDeltaSpec {
  int64_t hidden = 0, k_heads = 0, v_heads = 0, k_dim = 0, v_dim = 0, conv_kernel = 4;
  float norm_eps = 1e-6f;
};

class GatedDeltaNet {
 public:
  GatedDeltaNet() = default;
  GatedDeltaNet(WeightBinder& b, const std::string& prefix, const GatedDeltaSpec& spec);
  // x: [T, hidden] after the tokens the cache has seen (the activation type: F32, or BF16 on CUDA); returns
  // [T, hidden] F32 (for the F32 residual) and advances the cache.
  Tensor forward(const Tensor& x, SSMCache& cache) const;
  // Batched: x [N, hidden] holds the rows of s, caches[r] row r's state. Projections, norms and out_proj run
  // once over all rows; the conv window and the recurrence per row over its own state.
  Tensor forward_rows(const Tensor& x, const RowSpans& s, const std::vector<SSMCache*>& caches) const;
  // Whether the conv weight was stored in HF layout [C, 1, K] (an unconverted checkpoint) rather than
  // MLX's [C, K, 1]; unconverted Qwen3.5 checkpoints also keep zero-centred (1 + w) RMSNorm weights.
  bool hf_layout() const { return hf_layout_; }
  // The CPU's default path (weights packed for the integer-dot kernels): the conv's silu takes the polynomial exp
  // as the MLP's does; --exact keeps libm's.
  bool fast_exp() const { return in_qkv_.w.quantized && in_qkv_.w.q.cpu_packed; }

 private:
  // The input projections qkv, z, a, b over x, F32 (x quantized once for all on the CPU).
  std::vector<Tensor> project_in(const Tensor& x) const;
  GatedDeltaSpec spec_;
  Linear in_qkv_, in_z_, in_a_, in_b_, out_;
  Tensor conv_w_;           // [C, K] f32 (on the CPU a view of [K, C] storage)
  Tensor neg_a_, dt_bias_;  // −exp(A_log), dt_bias per value head: F32 [Hv] beside the weights
  Tensor norm_w_;
  bool hf_layout_ = true;
};

}  // namespace lathe
