// State-space / linear-attention kernels (Gated DeltaNet): the depthwise causal conv1d with a carried input
// window, and the gated delta-rule recurrence over an f32 state. Both run token by token, so a prefill and
// the same tokens decoded one at a time produce the same state.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "tensor/cpu/cpu_features.h"
#include "tensor/cpu/kernels.h"
#include "tensor/cpu/simd.h"
#include "tensor/cpu/simd512.h"
#include "tensor/thread_pool.h"

namespace lathe::cpu {
namespace {

// row[i] = update(row[i]) for every i, then dot(row, w): dot_f32's lanes and order over the updated values, so
// bitwise an update pass followed by dot_f32, in one pass over the row. vec updates 8 lanes at i, one a value.
template <typename Vec, typename One>
float update_then_dot(float* row, const float* w, int64_t n, Vec vec, One one) {
  int64_t i = 0;
  float s = 0.f;
#ifdef LATHE_AVX2
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    const __m256 r0 = vec(_mm256_loadu_ps(row + i), i), r1 = vec(_mm256_loadu_ps(row + i + 8), i + 8);
    _mm256_storeu_ps(row + i, r0);
    _mm256_storeu_ps(row + i + 8, r1);
    a0 = _mm256_fmadd_ps(r0, _mm256_loadu_ps(w + i), a0);
    a1 = _mm256_fmadd_ps(r1, _mm256_loadu_ps(w + i + 8), a1);
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 r0 = vec(_mm256_loadu_ps(row + i), i);
    _mm256_storeu_ps(row + i, r0);
    a0 = _mm256_fmadd_ps(r0, _mm256_loadu_ps(w + i), a0);
  }
  s = hsum(_mm256_add_ps(a0, a1));
#else
  (void)vec;
#endif
  for (int64_t j = i; j < n; ++j) row[j] = one(row[j], j);
  for (; i < n; ++i) s += row[i] * w[i];
  return s;
}

// row *= decay, then dot(row, k).
float scale_then_dot(float* row, float decay, const float* k, int64_t n) {
#ifdef LATHE_AVX2
  const __m256 vd = _mm256_set1_ps(decay);
  auto vec = [&](__m256 r, int64_t) { return _mm256_mul_ps(r, vd); };
#else
  auto vec = nullptr;
#endif
  return update_then_dot(row, k, n, vec, [&](float r, int64_t) { return r * decay; });
}

// row += delta · k (axpy_f32's arithmetic), then dot(row, q).
float axpy_then_dot(float delta, const float* k, float* row, const float* q, int64_t n) {
#ifdef LATHE_AVX2
  const __m256 va = _mm256_set1_ps(delta);
  auto vec = [&](__m256 r, int64_t i) { return _mm256_fmadd_ps(va, _mm256_loadu_ps(k + i), r); };
#else
  auto vec = nullptr;
#endif
  return update_then_dot(row, q, n, vec, [&](float r, int64_t i) { return r + delta * k[i]; });
}

// o[i] = o[i] / (1 + e^−o[i]) over [b, e). With fast_exp every element, the tail's too, goes through the same
// 8-lane polynomial exp (the tail padded), so a value never depends on where a range starts or ends.
void silu_range(float* o, int64_t b, int64_t e, bool fast_exp) {
#ifdef LATHE_AVX2
  if (fast_exp) {
    const __m256 one = _mm256_set1_ps(1.0f);
    auto silu8 = [&](__m256 v) {
      return _mm256_div_ps(v, _mm256_add_ps(one, exp_poly8(_mm256_sub_ps(_mm256_setzero_ps(), v))));
    };
    int64_t i = b;
    for (; i + 8 <= e; i += 8) _mm256_storeu_ps(o + i, silu8(_mm256_loadu_ps(o + i)));
    if (i < e) {
      alignas(32) float t[8] = {};
      std::copy(o + i, o + e, t);
      _mm256_store_ps(t, silu8(_mm256_load_ps(t)));
      std::copy(t, t + (e - i), o + i);
    }
    return;
  }
#else
  (void)fast_exp;
#endif
  for (int64_t i = b; i < e; ++i) o[i] = o[i] / (1.0f + std::exp(-o[i]));
}

#ifdef LATHE_A512
// One token's step on one value head's rows with 16-lane registers (AVX-512 machines, Dk a multiple of 32): the
// two passes of update_then_dot per row, two accumulators of 16 lanes each. Its sums differ in order from the
// 8-lane path's; on one machine a head's result still depends on nothing but its inputs.
LATHE_A512 void delta_step_512(float* Sh, int64_t Dv, int64_t Dk, float decay, float b, const float* kt,
                               const float* qt, const float* vt, float* yt) {
  const __m512 vd = _mm512_set1_ps(decay);
  for (int64_t i = 0; i < Dv; ++i) {
    float* row = Sh + i * Dk;
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    for (int64_t j = 0; j < Dk; j += 32) {
      const __m512 r0 = _mm512_mul_ps(_mm512_loadu_ps(row + j), vd);
      const __m512 r1 = _mm512_mul_ps(_mm512_loadu_ps(row + j + 16), vd);
      _mm512_storeu_ps(row + j, r0);
      _mm512_storeu_ps(row + j + 16, r1);
      a0 = _mm512_fmadd_ps(r0, _mm512_loadu_ps(kt + j), a0);
      a1 = _mm512_fmadd_ps(r1, _mm512_loadu_ps(kt + j + 16), a1);
    }
    const float delta = (vt[i] - reduce16(_mm512_add_ps(a0, a1))) * b;
    const __m512 va = _mm512_set1_ps(delta);
    a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    for (int64_t j = 0; j < Dk; j += 32) {
      const __m512 r0 = _mm512_fmadd_ps(va, _mm512_loadu_ps(kt + j), _mm512_loadu_ps(row + j));
      const __m512 r1 = _mm512_fmadd_ps(va, _mm512_loadu_ps(kt + j + 16), _mm512_loadu_ps(row + j + 16));
      _mm512_storeu_ps(row + j, r0);
      _mm512_storeu_ps(row + j + 16, r1);
      a0 = _mm512_fmadd_ps(r0, _mm512_loadu_ps(qt + j), a0);
      a1 = _mm512_fmadd_ps(r1, _mm512_loadu_ps(qt + j + 16), a1);
    }
    yt[i] = reduce16(_mm512_add_ps(a0, a1));
  }
}
#endif

}  // namespace

void causal_conv1d_silu(const Tensor& x, const Tensor& weight, Tensor& state, Tensor& out, bool fast_exp) {
  const int64_t T = x.dim(0), C = x.dim(1), K = weight.dim(1), P = K - 1;
  const float* xp = x.data<float>();
  const float* w = weight.data<float>();
  float* sp = state.data<float>();
  float* op = out.data<float>();
  // Input window [P + T, C]: the carried rows, then x.
  std::vector<float> win(static_cast<size_t>((P + T) * C));
  std::memcpy(win.data(), sp, static_cast<size_t>(P * C) * 4);
  std::memcpy(win.data() + P * C, xp, static_cast<size_t>(T * C) * 4);
  // Taps by channel ([K, C]), so a token's channels are contiguous in the weights as in the window. Every
  // output is w0·x0, then one fma per further tap, in lanes or in the tail alike: a value never depends on the
  // chunking, and a prefill and the same tokens one at a time agree. A weight stored that way (the transposed
  // view of a [K, C] tensor, as models keep it on the CPU) is read in place; a [C, K] one is transposed here.
  const bool by_channel = weight.stride(0) == 1 && weight.stride(1) == C;
  std::vector<float> transposed(by_channel ? 0 : static_cast<size_t>(K * C));
  const float* const wt = by_channel ? w : transposed.data();
  parallel_for(C, 16, [&](int64_t c0, int64_t c1) {
    if (!by_channel)
      for (int64_t c = c0; c < c1; ++c)  // each task transposes the channels it convolves
        for (int64_t j = 0; j < K; ++j) transposed[static_cast<size_t>(j * C + c)] = w[c * K + j];
    for (int64_t t = 0; t < T; ++t) {
      const float* xs = win.data() + t * C;
      float* o = op + t * C;
      int64_t c = c0;
#ifdef LATHE_AVX2
      for (; c + 8 <= c1; c += 8) {
        __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(wt + c), _mm256_loadu_ps(xs + c));
        for (int64_t j = 1; j < K; ++j)
          acc = _mm256_fmadd_ps(_mm256_loadu_ps(wt + j * C + c), _mm256_loadu_ps(xs + j * C + c), acc);
        _mm256_storeu_ps(o + c, acc);
      }
#endif
      for (; c < c1; ++c) {
        float acc = wt[c] * xs[c];
        for (int64_t j = 1; j < K; ++j) acc = std::fma(wt[j * C + c], xs[j * C + c], acc);
        o[c] = acc;
      }
      silu_range(o, c0, c1, fast_exp);
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
#ifdef LATHE_A512
  const bool wide = active_isa() == Isa::Avx512Vnni && Dk % 32 == 0;
#endif
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
#ifdef LATHE_A512
        if (wide) {
          delta_step_512(Sh, Dv, Dk, decay, b, kt, qt, vt, yt);
          continue;
        }
#endif
        for (int64_t i = 0; i < Dv; ++i) {
          float* row = Sh + i * Dk;
          const float delta = (vt[i] - scale_then_dot(row, decay, kt, Dk)) * b;
          yt[i] = axpy_then_dot(delta, kt, row, qt, Dk);
        }
      }
    }
  });
}

}  // namespace lathe::cpu
