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
namespace {

#ifdef LATHE_AVX2
// dot_f32 of one query with four keys: per key the very operations dot_f32 runs (so bitwise its results),
// with four keys' independent FMA chains in flight instead of one.
void attn_dot_x4(const float* q, const float* const* k, int64_t n, float* out) {
  __m256 a0[4], a1[4];
  for (int r = 0; r < 4; ++r) a0[r] = a1[r] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 qa = _mm256_loadu_ps(q + i), qb = _mm256_loadu_ps(q + i + 8);
    for (int r = 0; r < 4; ++r) {
      a0[r] = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k[r] + i), a0[r]);
      a1[r] = _mm256_fmadd_ps(qb, _mm256_loadu_ps(k[r] + i + 8), a1[r]);
    }
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 qa = _mm256_loadu_ps(q + i);
    for (int r = 0; r < 4; ++r) a0[r] = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k[r] + i), a0[r]);
  }
  for (int r = 0; r < 4; ++r) {
    float s = hsum(_mm256_add_ps(a0[r], a1[r]));
    for (int64_t t = i; t < n; ++t) s += q[t] * k[r][t];
    out[r] = s;
  }
}

// o = Σ_j exp(s_j − mx) · v_j / Σ_j exp(s_j − mx) over visible keys, NV·8 = Dv values: the same FMAs, in the same
// order, as axpy_f32 into a zeroed buffer, with the accumulators held in registers instead of memory.
template <int NV>
void attn_weighted_values(const float* scores, int64_t j0, int64_t j1, float mx, const float* v, int64_t vs0,
                          float* o) {
  __m256 acc[NV];
  for (int d = 0; d < NV; ++d) acc[d] = _mm256_setzero_ps();
  float sum = 0.f;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t j = j0; j < j1; ++j) {
    const float s = scores[j];
    if (s == neg_inf) continue;
    const float e = std::exp(s - mx);
    sum += e;
    const __m256 ve = _mm256_set1_ps(e);
    const float* vj = v + j * vs0;
    for (int d = 0; d < NV; ++d) acc[d] = _mm256_fmadd_ps(ve, _mm256_loadu_ps(vj + 8 * d), acc[d]);
  }
  const float inv = 1.0f / sum;
  for (int d = 0; d < NV; ++d) {
    alignas(32) float t[8];
    _mm256_store_ps(t, acc[d]);
    for (int l = 0; l < 8; ++l) o[8 * d + l] = t[l] * inv;
  }
}
#endif

}  // namespace

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
      int64_t jb = j0;
#ifdef LATHE_AVX2
      // Linear positions: every key in [j0, j1) is visible; score them four at a time.
      if (!p.k_pos) {
        for (; jb + 4 <= j1; jb += 4) {
          const float* keys[4];
          for (int r = 0; r < 4; ++r) keys[r] = kp + (jb + r) * ks0 + kh * ks1;
          float d4[4];
          attn_dot_x4(qv, keys, D, d4);
          for (int r = 0; r < 4; ++r) {
            float s = d4[r] * p.scale;
            if (p.softcap > 0.f) s = std::tanh(s / p.softcap) * p.softcap;
            scores[static_cast<size_t>(jb + r)] = s;
            mx = std::max(mx, s);
          }
        }
      }
#endif
      for (int64_t j = jb; j < j1; ++j) {
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
#ifdef LATHE_AVX2
      const float* vh = vp + kh * vs1;
      if (Dv == 64 || Dv == 128 || Dv == 256) {
        if (Dv == 64) attn_weighted_values<8>(scores.data(), j0, j1, mx, vh, vs0, o);
        if (Dv == 128) attn_weighted_values<16>(scores.data(), j0, j1, mx, vh, vs0, o);
        if (Dv == 256) attn_weighted_values<32>(scores.data(), j0, j1, mx, vh, vs0, o);
        continue;
      }
#endif
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
