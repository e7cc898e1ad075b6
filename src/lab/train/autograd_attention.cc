// Causal (optionally sliding-window, softcapped, block-diagonal for packed rows) GQA attention of one sequence
// with its backward. The forward
// keeps only each (head, query) log-sum-exp; backward recomputes the probabilities from it (as flash attention
// does), so memory stays O(T · heads) instead of O(T² · heads).
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "common/error.h"
#include "lab/train/autograd.h"
#include "tensor/thread_pool.h"

namespace lathe::train::ag {
namespace {

struct Ctx {
  int64_t T, Hq, Hkv, D, rep, qc, kc;
  AttnShape s;
  std::shared_ptr<const std::vector<int64_t>> seg;  // a copy: the backward closure outlives the caller's vector
  int64_t first_key(int64_t i) const {
    const int64_t w = s.window > 0 ? std::max<int64_t>(0, i - s.window + 1) : 0;
    return seg ? std::max(w, (*seg)[static_cast<size_t>(i)]) : w;
  }
  // The score of query i (head h) against key j after scale and softcap; *th gets tanh for the softcap chain.
  float score(const float* q, const float* k, int64_t h, int64_t i, int64_t j, float* th) const {
    const float* qr = q + i * qc + h * D;
    const float* kr = k + j * kc + (h / rep) * D;
    float d = 0.0f;
    for (int64_t x = 0; x < D; ++x) d += qr[x] * kr[x];
    d *= s.scale;
    if (s.softcap > 0) {
      const float t = std::tanh(d / s.softcap);
      *th = t;
      return t * s.softcap;
    }
    return d;
  }
};

}  // namespace

Var attention(Tape& t, const Var& q, const Var& k, const Var& v, const AttnShape& s) {
  Ctx c{q->rows, s.heads, s.kv_heads, s.head_dim, 0, q->cols, k->cols, s, nullptr};
  LATHE_CHECK(s.heads > 0 && s.kv_heads > 0 && s.heads % s.kv_heads == 0, "ag::attention: heads");
  LATHE_CHECK(q->cols == s.heads * s.head_dim && k->cols == s.kv_heads * s.head_dim && v->cols == k->cols &&
                  k->rows == c.T && v->rows == c.T,
              "ag::attention: shapes");
  c.rep = s.heads / s.kv_heads;
  if (s.segment_start) {
    LATHE_CHECK(static_cast<int64_t>(s.segment_start->size()) == c.T, "ag::attention: segment starts");
    for (int64_t i = 0; i < c.T; ++i) {
      const int64_t st = (*s.segment_start)[static_cast<size_t>(i)];
      LATHE_CHECK(st >= 0 && st <= i, "ag::attention: a segment starts after its row");
    }
    c.seg = std::make_shared<const std::vector<int64_t>>(*s.segment_start);
    c.s.segment_start = nullptr;
  }
  const int64_t T = c.T, D = c.D;
  Var y = make_var(T, q->cols, q->requires_grad || k->requires_grad || v->requires_grad);
  auto lse = std::make_shared<std::vector<float>>(static_cast<size_t>(c.Hq * T));
  parallel_for(c.Hq, 1, [&](int64_t h0, int64_t h1) {
    std::vector<float> sc(static_cast<size_t>(T));
    float th = 0;
    for (int64_t h = h0; h < h1; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const int64_t j0 = c.first_key(i);
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t j = j0; j <= i; ++j) {
          sc[static_cast<size_t>(j)] = c.score(q->v(), k->v(), h, i, j, &th);
          mx = std::max(mx, sc[static_cast<size_t>(j)]);
        }
        float sum = 0.0f;
        for (int64_t j = j0; j <= i; ++j) {
          sc[static_cast<size_t>(j)] = std::exp(sc[static_cast<size_t>(j)] - mx);
          sum += sc[static_cast<size_t>(j)];
        }
        (*lse)[static_cast<size_t>(h * T + i)] = mx + std::log(sum);
        float* out = y->value.data() + i * c.qc + h * D;
        for (int64_t j = j0; j <= i; ++j) {
          const float p = sc[static_cast<size_t>(j)] / sum;
          const float* vr = v->v() + j * c.kc + (h / c.rep) * D;
          for (int64_t x = 0; x < D; ++x) out[x] += p * vr[x];
        }
      }
  });
  if (y->requires_grad)
    t.record([q, k, v, y, lse, c] {
      const int64_t T = c.T, D = c.D;
      float* gq = q->g();
      float* gk = k->g();
      float* gv = v->g();
      // One task per kv head: it owns that head's dk/dv columns and its query heads' dq columns.
      parallel_for(c.Hkv, 1, [&](int64_t g0, int64_t g1) {
        std::vector<float> p(static_cast<size_t>(T)), th(static_cast<size_t>(T));
        for (int64_t g = g0; g < g1; ++g)
          for (int64_t h = g * c.rep; h < (g + 1) * c.rep; ++h)
            for (int64_t i = 0; i < T; ++i) {
              const int64_t j0 = c.first_key(i);
              const float l = (*lse)[static_cast<size_t>(h * T + i)];
              const float* go = y->grad.data() + i * c.qc + h * D;
              float dsum = 0.0f;
              for (int64_t j = j0; j <= i; ++j) {
                const float sj = c.score(q->v(), k->v(), h, i, j, &th[static_cast<size_t>(j)]);
                const float pj = std::exp(sj - l);
                const float* vr = v->v() + j * c.kc + g * D;
                float dp = 0.0f;
                for (int64_t x = 0; x < D; ++x) dp += go[x] * vr[x];
                p[static_cast<size_t>(j)] = pj;
                dsum += pj * dp;
                float* gvr = gv + j * c.kc + g * D;
                for (int64_t x = 0; x < D; ++x) gvr[x] += pj * go[x];
              }
              const float* qr = q->v() + i * c.qc + h * D;
              float* gqr = gq + i * c.qc + h * D;
              // Second pass: ds' = p (dp - Σ p dp) needs the whole sum; dp is recomputed (D flops).
              for (int64_t j = j0; j <= i; ++j) {
                const float* vr = v->v() + j * c.kc + g * D;
                float dp = 0.0f;
                for (int64_t x = 0; x < D; ++x) dp += go[x] * vr[x];
                float ds = p[static_cast<size_t>(j)] * (dp - dsum);
                if (c.s.softcap > 0) ds *= 1.0f - th[static_cast<size_t>(j)] * th[static_cast<size_t>(j)];
                ds *= c.s.scale;
                const float* kr = k->v() + j * c.kc + g * D;
                float* gkr = gk + j * c.kc + g * D;
                for (int64_t x = 0; x < D; ++x) {
                  gqr[x] += ds * kr[x];
                  gkr[x] += ds * qr[x];
                }
              }
            }
      });
    });
  return y;
}

}  // namespace lathe::train::ag
