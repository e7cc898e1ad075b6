#include "model/layers/attention.h"

namespace lathe {

Attention::Attention(WeightBinder& b, const std::string& p, const AttentionSpec& s) : spec_(s) {
  q_ = bind_linear(b, p + ".q_proj", s.heads * s.head_dim, s.hidden, s.qkv_bias);
  k_ = bind_linear(b, p + ".k_proj", s.kv_heads * s.head_dim, s.hidden, s.qkv_bias);
  v_ = bind_linear(b, p + ".v_proj", s.kv_heads * s.head_dim, s.hidden, s.qkv_bias);
  o_ = bind_linear(b, p + ".o_proj", s.hidden, s.heads * s.head_dim, s.o_bias);
  if (s.qk_norm) {
    q_norm_ = {b.tensor(p + ".q_norm.weight", {s.head_dim}), s.norm_eps, s.norm_plus_one};
    k_norm_ = {b.tensor(p + ".k_norm.weight", {s.head_dim}), s.norm_eps, s.norm_plus_one};
  }
}

Tensor Attention::forward(const Tensor& x, LayerCache& cache) const {
  const int64_t T = x.dim(0);
  const int64_t pos0 = cache.offset();
  Tensor q = q_(x).reshape({T, spec_.heads, spec_.head_dim});
  Tensor k = k_(x).reshape({T, spec_.kv_heads, spec_.head_dim});
  Tensor v = v_(x).reshape({T, spec_.kv_heads, spec_.head_dim});
  if (spec_.qk_norm) {
    q = q_norm_(q);
    k = k_norm_(k);
  }
  rope_inplace(q, spec_.rope, pos0);
  rope_inplace(k, spec_.rope, pos0);
  const KVView kv = cache.update(k, v);
  AttentionParams ap;
  ap.scale = spec_.scale;
  ap.softcap = spec_.softcap;
  ap.window = spec_.window;
  ap.q_pos0 = pos0;
  ap.k_pos0 = kv.pos0;
  ap.k_pos = kv.positions.empty() ? nullptr : &kv.positions;
  const Tensor out = attention(q, kv.k, kv.v, ap);
  return o_(out.reshape({T, spec_.heads * spec_.head_dim}));
}

}  // namespace lathe
