// Softmax attention with GQA, causal / sliding-window masks, optional tanh softcap. One (query, head) pair
// per task; f32 throughout.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "tensor/cpu/kernels.h"
#include "tensor/cpu/simd.h"
#include "tensor/thread_pool.h"

namespace lathe::cpu {

void attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, Tensor& out) {
  const int64_t T = q.dim(0), Hq = q.dim(1), D = q.dim(2);
  const int64_t S = k.dim(0), Hkv = k.dim(1), Dv = v.dim(2);
  const int64_t group = Hq / Hkv;
  const float* qp = q.data<float>();
  const float* kp = k.data<float>();
  const float* vp = v.data<float>();
  const int64_t ks0 = k.stride(0), ks1 = k.stride(1), vs0 = v.stride(0), vs1 = v.stride(1);
  const int64_t qs0 = q.stride(0), qs1 = q.stride(1);
  float* op = out.data<float>();
  const float neg_inf = -std::numeric_limits<float>::infinity();

  auto key_pos = [&](int64_t j) { return p.k_pos ? (*p.k_pos)[static_cast<size_t>(j)] : p.k_pos0 + j; };
  auto visible = [&](int64_t qpos, int64_t kpos) {
    if (p.causal && kpos > qpos) return false;
    if (p.window > 0 && qpos - kpos >= p.window) return false;
    return true;
  };

  parallel_for(T * Hq, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> scores(static_cast<size_t>(S));
    std::vector<float> acc(static_cast<size_t>(Dv));
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / Hq, h = i % Hq, kh = h / group;
      const int64_t qpos = p.q_pos0 + t;
      const float* qv = qp + t * qs0 + h * qs1;
      // Visible key range for linear positions; explicit positions check every key.
      int64_t j0 = 0, j1 = S;
      if (!p.k_pos) {
        if (p.causal) j1 = std::clamp<int64_t>(qpos - p.k_pos0 + 1, 0, S);
        if (p.window > 0) j0 = std::clamp<int64_t>(qpos - p.window + 1 - p.k_pos0, 0, S);
      }
      float mx = neg_inf;
      for (int64_t j = j0; j < j1; ++j) {
        float s;
        if (p.k_pos && !visible(qpos, key_pos(j))) {
          s = neg_inf;
        } else {
          s = dot_f32(qv, kp + j * ks0 + kh * ks1, D) * p.scale;
          if (p.softcap > 0.f) s = std::tanh(s / p.softcap) * p.softcap;
        }
        scores[static_cast<size_t>(j)] = s;
        mx = std::max(mx, s);
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      float* o = op + (t * Hq + h) * Dv;
      if (mx == neg_inf) {  // nothing visible: zero output rather than NaN
        std::fill(o, o + Dv, 0.f);
        continue;
      }
      float sum = 0.f;
      for (int64_t j = j0; j < j1; ++j) {
        const float s = scores[static_cast<size_t>(j)];
        if (s == neg_inf) continue;
        const float e = std::exp(s - mx);
        sum += e;
        axpy_f32(e, vp + j * vs0 + kh * vs1, acc.data(), Dv);
      }
      const float inv = 1.0f / sum;
      for (int64_t d = 0; d < Dv; ++d) o[d] = acc[static_cast<size_t>(d)] * inv;
    }
  });
}

}  // namespace lathe::cpu
