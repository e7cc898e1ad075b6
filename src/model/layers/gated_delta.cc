#include "model/layers/gated_delta.h"

#include <cmath>

#include "common/error.h"
#include "tensor/ops_extra.h"

namespace lathe {

GatedDeltaNet::GatedDeltaNet(WeightBinder& b, const std::string& p, const GatedDeltaSpec& s) : spec_(s) {
  const int64_t key_dim = s.k_heads * s.k_dim, value_dim = s.v_heads * s.v_dim;
  const int64_t C = 2 * key_dim + value_dim, K = s.conv_kernel;
  if (s.k_heads <= 0 || s.v_heads % s.k_heads != 0)
    throw Error(ErrorKind::Corrupt, "config.json: linear_num_value_heads must be a multiple of linear_num_key_heads");
  in_qkv_ = bind_linear(b, p + ".in_proj_qkv", C, s.hidden);
  in_z_ = bind_linear(b, p + ".in_proj_z", value_dim, s.hidden);
  in_a_ = bind_linear(b, p + ".in_proj_a", s.v_heads, s.hidden);
  in_b_ = bind_linear(b, p + ".in_proj_b", s.v_heads, s.hidden);
  out_ = bind_linear(b, p + ".out_proj", s.hidden, value_dim);
  const std::string conv = p + ".conv1d.weight";
  hf_layout_ = b.has(conv) && b.shape_of(conv) == Shape({C, 1, K});
  conv_w_ = b.tensor(conv, hf_layout_ ? Shape{C, 1, K} : Shape{C, K, 1}).to(DType::F32).contiguous().reshape({C, K});
  // The CPU kernel reads the taps by channel: stored [K, C] once here (a [C, K] view of it) instead of every call.
  if (conv_w_.device() == Device::CPU) conv_w_ = conv_w_.transpose(0, 1).contiguous().transpose(0, 1);
  std::vector<float> neg_a = b.tensor(p + ".A_log", {s.v_heads}).to_floats();
  for (float& v : neg_a) v = -std::exp(v);
  const Tensor dt_bias = b.tensor(p + ".dt_bias", {s.v_heads});
  neg_a_ = Tensor::from_floats(neg_a, {s.v_heads}).to(dt_bias.device());
  dt_bias_ = dt_bias.to(DType::F32);
  norm_w_ = b.tensor(p + ".norm.weight", {s.v_dim});
}

std::vector<Tensor> GatedDeltaNet::project_in(const Tensor& x) const {
  return linear_many(x, {&in_qkv_.w, &in_z_.w, &in_a_.w, &in_b_.w}, {}, /*f32_out=*/true);
}

// The projections emit F32 whatever the activation type: the decay exp(g) compounds over every later token, so
// a bf16 rounding of a (or of the conv input) would drift the state; the outputs are small vectors.
Tensor GatedDeltaNet::forward(const Tensor& x, SSMCache& cache) const {
  const std::vector<Tensor> lin = project_in(x);
  const int64_t T = x.dim(0), Hk = spec_.k_heads, Hv = spec_.v_heads, Dk = spec_.k_dim, Dv = spec_.v_dim;
  const int64_t key_dim = Hk * Dk;
  Tensor& conv_state = cache.conv_state(spec_.conv_kernel - 1, conv_w_.dim(0), x.device());
  const Tensor mixed = causal_conv1d_silu(lin[0], conv_w_, conv_state, fast_exp());
  Tensor q = l2_normalize(mixed.slice(1, 0, key_dim).reshape({T, Hk, Dk}), 1e-6f);
  const Tensor k = l2_normalize(mixed.slice(1, key_dim, 2 * key_dim).reshape({T, Hk, Dk}), 1e-6f);
  const Tensor v = mixed.slice(1, 2 * key_dim, mixed.dim(1)).reshape({T, Hv, Dv});
  scale_inplace(q, 1.0f / std::sqrt(static_cast<float>(Dk)));

  // Per token and value head: decay (log space) and the delta rule's step size.
  Tensor g, beta;
  delta_gates(lin[2], lin[3], neg_a_, dt_bias_, g, beta);
  Tensor& state = cache.recurrent_state(Hv, Dv, Dk, x.device());
  const Tensor y = gated_delta_rule(q, k, v, g, beta, state);
  cache.advance(T);
  const Tensor z = lin[1].reshape({T, Hv, Dv});
  // The gated norm feeds out_proj: back to the activation type there.
  const Tensor n = convert(rms_norm_gated(y, z, norm_w_, spec_.norm_eps).reshape({T, Hv * Dv}), x.dtype());
  return linear(n, out_.w, nullptr, /*f32_out=*/true);
}

Tensor GatedDeltaNet::forward_rows(const Tensor& x, const RowSpans& s, const std::vector<SSMCache*>& caches) const {
  LATHE_CHECK(caches.size() == s.rows(), "forward_rows: one state per row");
  if (s.rows() == 1) return forward(x, *caches[0]);
  const std::vector<Tensor> lin = project_in(x);
  const int64_t N = x.dim(0), Hk = spec_.k_heads, Hv = spec_.v_heads, Dk = spec_.k_dim, Dv = spec_.v_dim;
  const int64_t key_dim = Hk * Dk;
  const Tensor& qkv = lin[0];
  std::vector<Tensor> mixed_rows;
  for (size_t r = 0; r < s.rows(); ++r) {
    Tensor& conv_state = caches[r]->conv_state(spec_.conv_kernel - 1, conv_w_.dim(0), x.device());
    mixed_rows.push_back(causal_conv1d_silu(row_part(qkv, s, r), conv_w_, conv_state, fast_exp()));
  }
  const Tensor mixed = concat_rows(mixed_rows);
  Tensor q = l2_normalize(mixed.slice(1, 0, key_dim).reshape({N, Hk, Dk}), 1e-6f);
  const Tensor k = l2_normalize(mixed.slice(1, key_dim, 2 * key_dim).reshape({N, Hk, Dk}), 1e-6f);
  const Tensor v = mixed.slice(1, 2 * key_dim, mixed.dim(1)).contiguous().reshape({N, Hv, Dv});
  scale_inplace(q, 1.0f / std::sqrt(static_cast<float>(Dk)));
  Tensor g, beta;
  delta_gates(lin[2], lin[3], neg_a_, dt_bias_, g, beta);
  std::vector<Tensor> ys;
  for (size_t r = 0; r < s.rows(); ++r) {
    Tensor& state = caches[r]->recurrent_state(Hv, Dv, Dk, x.device());
    ys.push_back(gated_delta_rule(row_part(q, s, r), row_part(k, s, r), row_part(v, s, r), row_part(g, s, r),
                                  row_part(beta, s, r), state));
    caches[r]->advance(s.len[r]);
  }
  const Tensor z = lin[1].reshape({N, Hv, Dv});
  const Tensor n =
      convert(rms_norm_gated(concat_rows(ys), z, norm_w_, spec_.norm_eps).reshape({N, Hv * Dv}), x.dtype());
  return linear(n, out_.w, nullptr, /*f32_out=*/true);
}

}  // namespace lathe
