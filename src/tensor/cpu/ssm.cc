// State-space / linear-attention kernels (Gated DeltaNet): the depthwise causal conv1d with a carried input
// window, and the gated delta-rule recurrence over an f32 state. Both run token by token, so a prefill and
// the same tokens decoded one at a time produce the same state.
#include <cmath>
#include <cstring>
#include <vector>

#include "tensor/cpu/kernels.h"
#include "tensor/cpu/simd.h"
#include "tensor/thread_pool.h"

namespace lathe::cpu {

void causal_conv1d_silu(const Tensor& x, const Tensor& weight, Tensor& state, Tensor& out) {
  const int64_t T = x.dim(0), C = x.dim(1), K = weight.dim(1), P = K - 1;
  const float* xp = x.data<float>();
  const float* w = weight.data<float>();
  float* sp = state.data<float>();
  float* op = out.data<float>();
  // Input window [P + T, C]: the carried rows, then x.
  std::vector<float> win(static_cast<size_t>((P + T) * C));
  std::memcpy(win.data(), sp, static_cast<size_t>(P * C) * 4);
  std::memcpy(win.data() + P * C, xp, static_cast<size_t>(T * C) * 4);
  parallel_for(C, 16, [&](int64_t c0, int64_t c1) {
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = c0; c < c1; ++c) {
        float acc = 0.f;
        for (int64_t j = 0; j < K; ++j) acc += w[c * K + j] * win[static_cast<size_t>((t + j) * C + c)];
        op[t * C + c] = acc / (1.0f + std::exp(-acc));
      }
  });
  std::memcpy(sp, win.data() + T * C, static_cast<size_t>(P * C) * 4);
}

void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                      Tensor& state, Tensor& out) {
  const int64_t T = q.dim(0), Hk = q.dim(1), Dk = q.dim(2), Hv = v.dim(1), Dv = v.dim(2);
  const int64_t rep = Hv / Hk;
  const float* qp = q.data<float>();
  const float* kp = k.data<float>();
  const float* vp = v.data<float>();
  const float* gp = g.data<float>();
  const float* bp = beta.data<float>();
  float* S = state.data<float>();
  float* op = out.data<float>();
  // Heads are independent: one task per value head walks all tokens.
  parallel_for(Hv, 1, [&](int64_t h0, int64_t h1) {
    for (int64_t h = h0; h < h1; ++h) {
      const int64_t kh = h / rep;
      float* Sh = S + h * Dv * Dk;
      for (int64_t t = 0; t < T; ++t) {
        const float decay = std::exp(gp[t * Hv + h]);
        const float b = bp[t * Hv + h];
        const float* kt = kp + (t * Hk + kh) * Dk;
        const float* qt = qp + (t * Hk + kh) * Dk;
        const float* vt = vp + (t * Hv + h) * Dv;
        float* yt = op + (t * Hv + h) * Dv;
        for (int64_t i = 0; i < Dv; ++i) {
          float* row = Sh + i * Dk;
          for (int64_t j = 0; j < Dk; ++j) row[j] *= decay;
          const float delta = (vt[i] - dot_f32(row, kt, Dk)) * b;
          axpy_f32(delta, kt, row, Dk);
          yt[i] = dot_f32(row, qt, Dk);
        }
      }
    }
  });
}

}  // namespace lathe::cpu
