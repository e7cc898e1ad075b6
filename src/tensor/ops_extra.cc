// ops_extra.h: CPU implementations (the arithmetic the model layers used to run inline) and device dispatch.
#include "tensor/ops_extra.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <numeric>

#include "common/env.h"
#include "common/error.h"
#include "quant/affine.h"
#ifdef LATHE_HAVE_CUDA
#include "tensor/ops_cuda.h"
#endif

namespace lathe {

Tensor convert(const Tensor& x, DType t) {
  if (x.dtype() == t) return x;
#ifdef LATHE_HAVE_CUDA
  if (x.device() == Device::CUDA) return gpu::convert(x, t);
#endif
  return x.to(t);
}

void delta_gates(const Tensor& a_in, const Tensor& b_in, const Tensor& neg_a, const Tensor& dt_bias, Tensor& g,
                 Tensor& beta) {
  LATHE_CHECK(a_in.shape() == b_in.shape() && a_in.ndim() == 2 && neg_a.numel() == a_in.dim(1) &&
                  dt_bias.numel() == a_in.dim(1),
              "delta_gates: shapes");
#ifdef LATHE_HAVE_CUDA
  if (a_in.device() == Device::CUDA) return gpu::delta_gates(a_in, b_in, neg_a, dt_bias, g, beta);
#endif
  const int64_t T = a_in.dim(0), H = a_in.dim(1);
  const std::vector<float> a = a_in.to_floats(), bl = b_in.to_floats(), na = neg_a.to_floats(),
                           dt = dt_bias.to_floats();
  g = Tensor::empty({T, H}, DType::F32);
  beta = Tensor::empty({T, H}, DType::F32);
  float* gp = g.data<float>();
  float* bp = beta.data<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const size_t i = static_cast<size_t>(t * H + h);
      const float u = a[i] + dt[static_cast<size_t>(h)];
      const float softplus = u > 20.f ? u : std::log1p(std::exp(u));
      gp[i] = na[static_cast<size_t>(h)] * softplus;
      bp[i] = 1.0f / (1.0f + std::exp(-bl[i]));
    }
}

void router_topk(const Tensor& scores_in, const Tensor& expert_scale, int64_t K, Tensor& idx_out, Tensor& w_out) {
  LATHE_CHECK(scores_in.ndim() == 2 && scores_in.dtype() == DType::F32 && expert_scale.numel() == scores_in.dim(1) &&
                  K > 0 && K <= scores_in.dim(1),
              "router_topk: expects F32 scores [T, E] and k ≤ E");
#ifdef LATHE_HAVE_CUDA
  if (scores_in.device() == Device::CUDA) return gpu::router_topk(scores_in, expert_scale, K, idx_out, w_out);
#endif
  const std::vector<float> scores = scores_in.to_floats(), scale = expert_scale.to_floats();
  const int64_t T = scores_in.dim(0), E = scores_in.dim(1);
  idx_out = Tensor::empty({T, K}, DType::I32);
  w_out = Tensor::empty({T, K}, DType::F32);
  int32_t* idx = idx_out.data<int32_t>();
  float* weights = w_out.data<float>();
  std::vector<float> prob(static_cast<size_t>(E));
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const float* s = scores.data() + t * E;
    const float mx = *std::max_element(s, s + E);
    float sum = 0.f;
    for (int64_t e = 0; e < E; ++e) sum += prob[static_cast<size_t>(e)] = std::exp(s[e] - mx);
    for (float& p : prob) p /= sum;
    std::iota(order.begin(), order.end(), 0);
    // Highest probability first; ties keep the lower expert index.
    std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int32_t a, int32_t c) {
      const float pa = prob[static_cast<size_t>(a)], pc = prob[static_cast<size_t>(c)];
      return pa > pc || (pa == pc && a < c);
    });
    float top_sum = 0.f;
    for (int64_t k = 0; k < K; ++k) top_sum += prob[static_cast<size_t>(order[static_cast<size_t>(k)])];
    for (int64_t k = 0; k < K; ++k) {
      const int32_t e = order[static_cast<size_t>(k)];
      idx[t * K + k] = e;
      weights[t * K + k] = prob[static_cast<size_t>(e)] / top_sum * scale[static_cast<size_t>(e)];
    }
  }
}

Tensor rms_norm_rope(const Tensor& x, const Tensor& weight, float eps, bool plus_one, const RopeTable& rope,
                     int64_t pos0) {
  LATHE_CHECK(x.ndim() == 3 && rope.dims <= x.dim(2) && static_cast<int64_t>(rope.inv_freq.size()) == rope.dims / 2,
              "rms_norm_rope: expects [T, H, D] and a rope table that fits the head");
#ifdef LATHE_HAVE_CUDA
  if (x.device() == Device::CUDA) return gpu::rms_norm_rope(x, weight, eps, plus_one, rope, pos0);
#endif
  Tensor out = rms_norm(x, weight, eps, plus_one);
  rope_inplace(out, rope, pos0);
  return out;
}

namespace {
// -1: not yet read from LATHE_BATCHED_DECODE.
std::atomic<int> g_batched_decode{-1};
}  // namespace

bool batched_decode_enabled() {
  int v = g_batched_decode.load(std::memory_order_relaxed);
  if (v < 0) {
    v = env_switch("LATHE_BATCHED_DECODE") ? 1 : 0;
    g_batched_decode.store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

void set_batched_decode_enabled(bool on) { g_batched_decode.store(on ? 1 : 0, std::memory_order_relaxed); }

Tensor qkv_rope_append_rows(const Tensor& y, const QkvStep& s, const RopeTable& rope,
                            const std::vector<AppendSlot>& slots, const GraphTable* table) {
  LATHE_CHECK(rope.dims <= s.head_dim && static_cast<int64_t>(rope.inv_freq.size()) == rope.dims / 2,
              "qkv_rope_append: rope table does not fit the head");
#ifdef LATHE_HAVE_CUDA
  if (y.device() == Device::CUDA) return gpu::qkv_rope_append_rows(y, s, rope, slots, table);
#endif
  (void)table;
  return Tensor();
}

bool quantized_append_covers(Device d, int64_t head_dim, int bits, int group_size) {
#ifdef LATHE_HAVE_CUDA
  return d == Device::CUDA && gpu::quantized_append_covers(head_dim, bits, group_size);
#else
  (void)d;
  (void)head_dim;
  (void)bits;
  (void)group_size;
  return false;
#endif
}

Tensor qkv_rope_append_quantized_rows(const Tensor& y, const QkvStep& s, const RopeTable& rope,
                                      const std::vector<QuantAppendSlot>& slots, int bits, int group_size,
                                      const GraphTable* table) {
  LATHE_CHECK(rope.dims <= s.head_dim && static_cast<int64_t>(rope.inv_freq.size()) == rope.dims / 2,
              "qkv_rope_append: rope table does not fit the head");
#ifdef LATHE_HAVE_CUDA
  if (quantized_append_covers(y.device(), s.head_dim, bits, group_size))
    return gpu::qkv_rope_append_quantized_rows(y, s, rope, slots, bits, group_size, table);
#endif
  (void)slots;
  (void)table;
  return Tensor();
}

bool copy_segments_available(Device d) {
#ifdef LATHE_HAVE_CUDA
  return d == Device::CUDA;
#else
  (void)d;
  return false;
#endif
}

void copy_segments(const std::vector<CopySegment>& segs, const GraphTable* table) {
#ifdef LATHE_HAVE_CUDA
  gpu::copy_segments(segs, table);
#else
  (void)table;
  LATHE_CHECK(segs.empty(), "copy_segments: no device backend in this build");
#endif
}

int64_t exact_batched_decode_rows() {
#ifdef LATHE_HAVE_CUDA
  return gpu::exact_decode_rows();
#else
  return 0;
#endif
}

Tensor attention_decode_rows(const std::vector<DecodeKV>& rows, const AttentionParams& p, const GraphTable* table) {
#ifdef LATHE_HAVE_CUDA
  if (!rows.empty() && rows[0].q.device() == Device::CUDA) return gpu::attention_decode_rows(rows, p, table);
#endif
  (void)p;
  (void)table;
  return Tensor();
}

Tensor qkv_rope_append(const Tensor& y, const QkvStep& s, const RopeTable& rope, int64_t pos0, Tensor& keys,
                       Tensor& values, int64_t row) {
  const int64_t qn = s.q_heads * s.head_dim, kn = s.kv_heads * s.head_dim;
  LATHE_CHECK(y.ndim() == 2 && y.dim(0) == 1 && y.dim(1) == qn + 2 * kn && y.is_contiguous(),
              "qkv_rope_append: expects one contiguous row of q|k|v heads");
  LATHE_CHECK(keys.ndim() == 3 && keys.dim(1) == s.kv_heads && keys.dim(2) == s.head_dim &&
                  values.shape() == keys.shape() && row >= 0 && row < keys.dim(0) && keys.dtype() == y.dtype() &&
                  values.dtype() == y.dtype(),
              "qkv_rope_append: cache buffers do not match the heads");
  LATHE_CHECK(rope.dims <= s.head_dim && static_cast<int64_t>(rope.inv_freq.size()) == rope.dims / 2,
              "qkv_rope_append: rope table does not fit the head");
#ifdef LATHE_HAVE_CUDA
  if (y.device() == Device::CUDA) return gpu::qkv_rope_append(y, s, rope, pos0, keys, values, row);
#endif
  // Copies: y is an input and must not be roped in place.
  Tensor q = y.slice(1, 0, qn).clone().reshape({1, s.q_heads, s.head_dim});
  Tensor k = y.slice(1, qn, qn + kn).clone().reshape({1, s.kv_heads, s.head_dim});
  const Tensor v = y.slice(1, qn + kn, qn + 2 * kn).contiguous().reshape({1, s.kv_heads, s.head_dim});
  if (s.norm) {
    q = rms_norm_rope(q, s.q_w, s.eps, s.plus_one, rope, pos0);
    k = rms_norm_rope(k, s.k_w, s.eps, s.plus_one, rope, pos0);
  } else {
    rope_inplace(q, rope, pos0);
    rope_inplace(k, rope, pos0);
  }
  copy_rows(keys, row, k, 0, 1);
  copy_rows(values, row, v, 0, 1);
  return q;
}

Tensor add_rms_norm(Tensor& h, const Tensor& b, const Tensor& weight, float eps, bool plus_one, DType out) {
  LATHE_CHECK(h.shape() == b.shape() && h.is_contiguous(), "add_rms_norm: shapes differ");
#ifdef LATHE_HAVE_CUDA
  if (h.device() == Device::CUDA) return gpu::add_rms_norm(h, b, weight, eps, plus_one, out);
#endif
  add_inplace(h, b);
  return rms_norm(h, weight, eps, plus_one, out);
}

QuantizedMatrix quantize_kv(const Tensor& x_in, int bits, int group_size) {
  LATHE_CHECK(x_in.ndim() == 2, "quantize_kv: expects [rows, cols]");
#ifdef LATHE_HAVE_CUDA
  if (x_in.device() == Device::CUDA) return gpu::quantize_kv(x_in, bits, group_size);
#endif
  const Tensor x = x_in.contiguous();
  LATHE_CHECK(x.dtype() == DType::F32, "quantize_kv: the cpu quantizes F32 rows");
  return quant::quantize_kv_rows(x.data<float>(), x.dim(0), x.dim(1), bits, group_size, DType::F32);
}

}  // namespace lathe
