// Training attention through cuBLAS (train_kernels.h: attention_gemm). Query head h = g · rep + r reads kv head g;
// for a fixed r the heads g of a chunk are evenly strided in q (rep · D), k / v (D) and the score scratch
// (rep · T²), so each product is one strided-batched GEMM per r. The whole [T, T] is computed (the masked half
// too): wasted flops, but at GEMM speed, which the direct kernels' per-key warp reductions are far from.
#include <algorithm>

#include "tensor/cuda/train_kernels.h"

namespace lathe::cuda::train {
namespace {

constexpr int64_t kScoreBudget = int64_t{128} << 20;  // floats per scratch buffer (512 MiB) before chunking groups

int64_t groups_per_chunk(const AttnArgs& a) {
  const int64_t rep = a.Hq / a.Hkv, per_group = rep * a.T * a.T;
  return std::clamp<int64_t>(kScoreBudget / std::max<int64_t>(1, per_group), 1, a.Hkv);
}

// s[(g - g0) · rep + r] = scale · Q_h · K_gᵀ for the chunk's groups.
void raw_scores(const AttnArgs& a, int64_t g0, int64_t ng, float* s) {
  const int64_t rep = a.Hq / a.Hkv, TT = a.T * a.T;
  for (int64_t r = 0; r < rep; ++r)
    sgemm_batched(false, true, a.T, a.T, a.D, a.scale, a.q + (g0 * rep + r) * a.D, a.qc, rep * a.D, a.k + g0 * a.D,
                  a.kc, a.D, 0.0f, s + r * TT, a.T, rep * TT, ng);
}

}  // namespace

int64_t attention_gemm_scratch(const AttnArgs& a) { return groups_per_chunk(a) * (a.Hq / a.Hkv) * a.T * a.T; }

void attention_gemm(const AttnArgs& a, float* out, float* lse, float* s) {
  const int64_t rep = a.Hq / a.Hkv, TT = a.T * a.T, gc = groups_per_chunk(a);
  for (int64_t g0 = 0; g0 < a.Hkv; g0 += gc) {
    const int64_t ng = std::min(gc, a.Hkv - g0);
    raw_scores(a, g0, ng, s);
    attention_softmax_rows(a, g0 * rep, ng * rep * a.T, s, lse);
    for (int64_t r = 0; r < rep; ++r)  // O_h = P_h · V_g
      sgemm_batched(false, false, a.T, a.D, a.T, 1.0f, s + r * TT, a.T, rep * TT, a.v + g0 * a.D, a.kc, a.D, 0.0f,
                    out + (g0 * rep + r) * a.D, a.qc, rep * a.D, ng);
  }
}

void attention_gemm_backward(const AttnArgs& a, const float* lse, const float* gout, float* s, float* dp, float* gq,
                             float* gk, float* gv) {
  const int64_t rep = a.Hq / a.Hkv, TT = a.T * a.T, gc = groups_per_chunk(a);
  for (int64_t g0 = 0; g0 < a.Hkv; g0 += gc) {
    const int64_t ng = std::min(gc, a.Hkv - g0);
    raw_scores(a, g0, ng, s);
    for (int64_t r = 0; r < rep; ++r)  // dP_h = dO_h · V_gᵀ
      sgemm_batched(false, true, a.T, a.T, a.D, 1.0f, gout + (g0 * rep + r) * a.D, a.qc, rep * a.D, a.v + g0 * a.D,
                    a.kc, a.D, 0.0f, dp + r * TT, a.T, rep * TT, ng);
    attention_softmax_backward_rows(a, g0 * rep, ng * rep * a.T, lse, s, dp);
    for (int64_t r = 0; r < rep; ++r) {
      const float* qh = a.q + (g0 * rep + r) * a.D;
      const float* goh = gout + (g0 * rep + r) * a.D;
      // dV_g += P_hᵀ · dO_h; dQ_h += dS_h · K_g; dK_g += dS_hᵀ · Q_h.
      sgemm_batched(true, false, a.T, a.D, a.T, 1.0f, s + r * TT, a.T, rep * TT, goh, a.qc, rep * a.D, 1.0f,
                    gv + g0 * a.D, a.kc, a.D, ng);
      sgemm_batched(false, false, a.T, a.D, a.T, 1.0f, dp + r * TT, a.T, rep * TT, a.k + g0 * a.D, a.kc, a.D, 1.0f,
                    gq + (g0 * rep + r) * a.D, a.qc, rep * a.D, ng);
      sgemm_batched(true, false, a.T, a.D, a.T, 1.0f, dp + r * TT, a.T, rep * TT, qh, a.qc, rep * a.D, 1.0f,
                    gk + g0 * a.D, a.kc, a.D, ng);
    }
  }
}

}  // namespace lathe::cuda::train
