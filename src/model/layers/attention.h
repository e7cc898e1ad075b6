// Multi-head attention with GQA: q/k/v projections (optional bias), optional per-head q/k RMSNorm, RoPE,
// causal or sliding-window softmax attention through a layer cache, output projection.
#pragma once
#include <string>

#include "cache/layer_cache.h"
#include "model/layers/modules.h"

namespace lathe {

struct AttentionSpec {
  int64_t hidden = 0, heads = 0, kv_heads = 0, head_dim = 0;
  bool qkv_bias = false, o_bias = false;
  bool qk_norm = false;
  bool norm_plus_one = false;
  float norm_eps = 1e-6f;
  float scale = 1.0f;
  float softcap = 0.0f;
  int64_t window = 0;  // > 0 for sliding layers
  RopeTable rope;
};

class Attention {
 public:
  Attention() = default;
  Attention(WeightBinder& b, const std::string& prefix, const AttentionSpec& spec);
  // x: [T, hidden]; returns [T, hidden]. Positions continue from cache.offset().
  Tensor forward(const Tensor& x, LayerCache& cache) const;
  const AttentionSpec& spec() const { return spec_; }

 private:
  AttentionSpec spec_;
  Linear q_, k_, v_, o_;
  RMSNorm q_norm_, k_norm_;
};

}  // namespace lathe
