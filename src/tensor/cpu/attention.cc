// Softmax attention with GQA, causal / sliding-window masks, optional tanh softcap. One (query, head) pair
// per task; f32 arithmetic over f32 or bf16 keys and values.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "tensor/cpu/kernels.h"
#include "tensor/cpu/simd.h"
#include "tensor/thread_pool.h"

namespace lathe::cpu {
namespace {
namespace f32_attn {  // (a namespace of its own: unity builds merge the anonymous namespaces of several files)

// K/V rows are f32, or bf16 (a CPU cache with cpu_kv_bf16): each value widens to f32 exactly as it is read.
inline float widen(float x) { return x; }
inline float widen(uint16_t x) {
  const uint32_t bits = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

#ifdef LATHE_AVX2
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) { return load_bf16x8(p); }
#endif

// dot_f32 with a key of either type (for f32 keys exactly dot_f32).
template <class KT>
float dot_key(const float* q, const KT* k, int64_t n) {
  if constexpr (std::is_same_v<KT, float>) {
    return dot_f32(q, k, n);
  } else {
    int64_t i = 0;
    float s = 0.f;
#ifdef LATHE_AVX2
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
      a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8(k + i), a0);
      a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), load8(k + i + 8), a1);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8(k + i), a0);
    s = hsum(_mm256_add_ps(a0, a1));
#endif
    for (; i < n; ++i) s += q[i] * widen(k[i]);
    return s;
  }
}

#ifdef LATHE_AVX2
// dot_key of one query with four keys: per key the very operations dot_key runs (so bitwise its results),
// with four keys' independent FMA chains in flight instead of one.
template <class KT>
void attn_dot_x4(const float* q, const KT* const* k, int64_t n, float* out) {
  __m256 a0[4], a1[4];
  for (int r = 0; r < 4; ++r) a0[r] = a1[r] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 qa = _mm256_loadu_ps(q + i), qb = _mm256_loadu_ps(q + i + 8);
    for (int r = 0; r < 4; ++r) {
      a0[r] = _mm256_fmadd_ps(qa, load8(k[r] + i), a0[r]);
      a1[r] = _mm256_fmadd_ps(qb, load8(k[r] + i + 8), a1[r]);
    }
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 qa = _mm256_loadu_ps(q + i);
    for (int r = 0; r < 4; ++r) a0[r] = _mm256_fmadd_ps(qa, load8(k[r] + i), a0[r]);
  }
  for (int r = 0; r < 4; ++r) {
    float s = hsum(_mm256_add_ps(a0[r], a1[r]));
    for (int64_t t = i; t < n; ++t) s += q[t] * widen(k[r][t]);
    out[r] = s;
  }
}

// o = Σ_j w_j · v_j / Σ_j w_j over the keys, w = softmax_weights8 of the scores (which it overwrites), NV·8 = Dv
// values, the accumulators in registers; keys of weight 0 (masked) are skipped.
template <int NV, class KT>
void attn_weighted_values(float* scores, int64_t j0, int64_t j1, float mx, const KT* v, int64_t vs0, bool prefetch,
                          float* o) {
  const float sum = softmax_weights8(scores, j0, j1, mx);
  __m256 acc[NV];
  for (int d = 0; d < NV; ++d) acc[d] = _mm256_setzero_ps();
  for (int64_t j = j0; j < j1; ++j) {
    const float e = scores[j];
    if (e == 0.f) continue;
    const __m256 ve = _mm256_set1_ps(e);
    const KT* vj = v + j * vs0;
    if (prefetch && j + kKvPrefetchKeys < j1) prefetch_bytes(vj + kKvPrefetchKeys * vs0, 8 * NV * sizeof(KT));
    for (int d = 0; d < NV; ++d) acc[d] = _mm256_fmadd_ps(ve, load8(vj + 8 * d), acc[d]);
  }
  const float inv = 1.0f / sum;
  for (int d = 0; d < NV; ++d) {
    alignas(32) float t[8];
    _mm256_store_ps(t, acc[d]);
    for (int l = 0; l < 8; ++l) o[8 * d + l] = t[l] * inv;
  }
}
#endif

// A call's tensors as the kernels below read them (`io`): sizes (q [T, Hq, D], k [S, Hkv, D], v [S, Hkv, Dv]), the
// query heads per KV head, data pointers and strides.
template <class KT>
struct Operands {
  Operands(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out)
      : T(q.dim(0)),
        Hq(q.dim(1)),
        D(q.dim(2)),
        S(k.dim(0)),
        Dv(v.dim(2)),
        group(q.dim(1) / k.dim(1)),
        qp(q.data<float>()),
        kp(k.data<KT>()),
        vp(v.data<KT>()),
        op(out.data<float>()),
        qs0(q.stride(0)),
        qs1(q.stride(1)),
        ks0(k.stride(0)),
        ks1(k.stride(1)),
        vs0(v.stride(0)),
        vs1(v.stride(1)) {}
  int64_t T, Hq, D, S, Dv, group;
  const float* qp;
  const KT* kp;
  const KT* vp;
  float* op;
  int64_t qs0, qs1, ks0, ks1, vs0, vs1;
};

#ifdef LATHE_AVX2
// Two query heads against two keys: out[h][r] is exactly dot_key(q_h, k_r) (the same FMAs in the same order),
// with each key chunk loaded (and widened) once for both heads.
template <class KT>
void attn_dot_2x2(const float* const* q, const KT* const* k, int64_t n, float (&out)[2][2]) {
  __m256 a0[2][2], a1[2][2];
  for (int h = 0; h < 2; ++h)
    for (int r = 0; r < 2; ++r) a0[h][r] = a1[h][r] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 ka[2] = {load8(k[0] + i), load8(k[1] + i)};
    const __m256 kb[2] = {load8(k[0] + i + 8), load8(k[1] + i + 8)};
    for (int h = 0; h < 2; ++h) {
      const __m256 qa = _mm256_loadu_ps(q[h] + i), qb = _mm256_loadu_ps(q[h] + i + 8);
      for (int r = 0; r < 2; ++r) {
        a0[h][r] = _mm256_fmadd_ps(qa, ka[r], a0[h][r]);
        a1[h][r] = _mm256_fmadd_ps(qb, kb[r], a1[h][r]);
      }
    }
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 ka[2] = {load8(k[0] + i), load8(k[1] + i)};
    for (int h = 0; h < 2; ++h) {
      const __m256 qa = _mm256_loadu_ps(q[h] + i);
      for (int r = 0; r < 2; ++r) a0[h][r] = _mm256_fmadd_ps(qa, ka[r], a0[h][r]);
    }
  }
  for (int h = 0; h < 2; ++h)
    for (int r = 0; r < 2; ++r) {
      float s = hsum(_mm256_add_ps(a0[h][r], a1[h][r]));
      for (int64_t t = i; t < n; ++t) s += q[h][t] * widen(k[r][t]);
      out[h][r] = s;
    }
}

// GQA with an even number of query heads per KV head: one task per pair of query heads, which score every key
// row with one load (and widening) for both. Per head the operations are those of the one-head path below, in
// the same order, so the outputs are bitwise the same.
template <class KT, int NV>
void attention_pairs(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, Tensor& out) {
  const Operands<KT> io(q, k, v, out);
  const int64_t pairs = io.Hq / 2;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  auto finish_score = [&](float d) {
    float s = d * p.scale;
    if (p.softcap > 0.f) s = std::tanh(s / p.softcap) * p.softcap;
    return s;
  };
  const bool prefetch = attention_prefetches(io.T);
  const auto tasks = [&](int64_t i0, int64_t i1) {
    std::vector<float> scores[2] = {std::vector<float>(static_cast<size_t>(io.S)),
                                    std::vector<float>(static_cast<size_t>(io.S))};
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / pairs, h0 = 2 * (i % pairs), kh = h0 / io.group;
      const int64_t qpos = p.q_pos0 + t;
      const float* qv[2] = {io.qp + t * io.qs0 + h0 * io.qs1, io.qp + t * io.qs0 + (h0 + 1) * io.qs1};
      int64_t j0, j1;
      visible_key_range(p, qpos, io.S, j0, j1);
      float mx[2] = {neg_inf, neg_inf};
      int64_t jb = j0;
      if (!p.k_pos) {
        for (; jb + 2 <= j1; jb += 2) {
          const KT* keys[2] = {io.kp + jb * io.ks0 + kh * io.ks1, io.kp + (jb + 1) * io.ks0 + kh * io.ks1};
          if (prefetch && jb + kKvPrefetchKeys + 2 <= j1)
            for (int r = 0; r < 2; ++r) prefetch_bytes(keys[r] + kKvPrefetchKeys * io.ks0, io.D * sizeof(KT));
          float d[2][2];
          attn_dot_2x2(qv, keys, io.D, d);
          for (int h = 0; h < 2; ++h)
            for (int r = 0; r < 2; ++r) {
              const float s = finish_score(d[h][r]);
              scores[h][static_cast<size_t>(jb + r)] = s;
              mx[h] = std::max(mx[h], s);
            }
        }
      }
      for (int64_t j = jb; j < j1; ++j) {
        const bool seen = !p.k_pos || key_visible(p, qpos, (*p.k_pos)[static_cast<size_t>(j)]);
        for (int h = 0; h < 2; ++h) {
          const float s = seen ? finish_score(dot_key(qv[h], io.kp + j * io.ks0 + kh * io.ks1, io.D)) : neg_inf;
          scores[h][static_cast<size_t>(j)] = s;
          mx[h] = std::max(mx[h], s);
        }
      }
      // Values per head as the one-head path does them (the second head reads the V rows from cache).
      for (int h = 0; h < 2; ++h) {
        float* o = io.op + (t * io.Hq + h0 + h) * io.Dv;
        if (mx[h] == neg_inf) {  // nothing visible: zeros rather than NaN
          std::fill(o, o + io.Dv, 0.f);
          continue;
        }
        attn_weighted_values<NV>(scores[h].data(), j0, j1, mx[h], io.vp + kh * io.vs1, io.vs0, prefetch, o);
      }
    }
  };
  parallel_for(io.T * pairs, 1, tasks, attention_chunks_per_thread(io.T));
}
#endif

#ifdef LATHE_AVX2
// Prefill (more than kAttentionDecodeRows query rows): a task takes kPrefillQueryBlock consecutive query rows of
// HN heads of one KV head (HN = 2: a pair, as attention_pairs) and walks the keys in blocks of kPrefillKeyBlock,
// so each K/V row is read from memory once per query block and then from L1 by each of its queries. Per query
// every score is dot_key's (any of the grouped dots gives its bits), the weights are softmax_weights8 from the
// query's first visible key, and the value rows are summed with the same FMAs in the same key order as
// attn_weighted_values (the accumulators parked in memory between key blocks), so each row's output is bitwise
// its one-row (decode path) result.
constexpr int64_t kPrefillQueryBlock = 8, kPrefillKeyBlock = 64;

template <class KT, int HN, int NV>
void attention_prefill_blocks(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p,
                              Tensor& out) {
  const Operands<KT> io(q, k, v, out);
  const int64_t per_row = io.Hq / HN, blocks = (io.T + kPrefillQueryBlock - 1) / kPrefillQueryBlock;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const auto tasks = [&](int64_t i0, int64_t i1) {
    std::vector<float> scores(static_cast<size_t>(kPrefillQueryBlock * HN * io.S));
    std::vector<float> acc(static_cast<size_t>(kPrefillQueryBlock * HN * io.Dv));
    for (int64_t task = i0; task < i1; ++task) {
      const int64_t t0 = (task / per_row) * kPrefillQueryBlock, n = std::min(io.T, t0 + kPrefillQueryBlock) - t0;
      const int64_t h0 = (task % per_row) * HN, kh = h0 / io.group;
      const KT* kbase = io.kp + kh * io.ks1;
      const KT* vbase = io.vp + kh * io.vs1;
      int64_t lo[kPrefillQueryBlock], hi[kPrefillQueryBlock], jmin = io.S, jmax = 0;
      const float* qv[kPrefillQueryBlock][HN];
      for (int64_t i = 0; i < n; ++i) {
        visible_key_range(p, p.q_pos0 + t0 + i, io.S, lo[i], hi[i]);
        if (lo[i] < hi[i]) jmin = std::min(jmin, lo[i]), jmax = std::max(jmax, hi[i]);
        for (int h = 0; h < HN; ++h) qv[i][h] = io.qp + (t0 + i) * io.qs0 + (h0 + h) * io.qs1;
      }
      const auto row = [&](int64_t i, int h) { return scores.data() + (i * HN + h) * io.S; };
      for (int64_t b0 = jmin; b0 < jmax; b0 += kPrefillKeyBlock) {  // raw dots, a key block at a time
        const int64_t b1 = std::min(jmax, b0 + kPrefillKeyBlock);
        for (int64_t i = 0; i < n; ++i) {
          int64_t j = std::max(b0, lo[i]);
          const int64_t end = std::min(b1, hi[i]);
          if constexpr (HN == 2) {
            for (; j + 2 <= end; j += 2) {
              const KT* keys[2] = {kbase + j * io.ks0, kbase + (j + 1) * io.ks0};
              float d[2][2];
              attn_dot_2x2(qv[i], keys, io.D, d);
              for (int h = 0; h < 2; ++h)
                for (int r = 0; r < 2; ++r) row(i, h)[j + r] = d[h][r];
            }
          } else {
            for (; j + 4 <= end; j += 4) {
              const KT* keys[4] = {kbase + j * io.ks0, kbase + (j + 1) * io.ks0, kbase + (j + 2) * io.ks0,
                                   kbase + (j + 3) * io.ks0};
              attn_dot_x4(qv[i][0], keys, io.D, row(i, 0) + j);
            }
          }
          for (; j < end; ++j)
            for (int h = 0; h < HN; ++h) row(i, h)[j] = dot_key(qv[i][h], kbase + j * io.ks0, io.D);
        }
      }
      float total[kPrefillQueryBlock][HN];
      bool live[kPrefillQueryBlock][HN];
      for (int64_t i = 0; i < n; ++i) {
        const int64_t qpos = p.q_pos0 + t0 + i;
        for (int h = 0; h < HN; ++h) {
          float* w = row(i, h);
          float mx = neg_inf;
          for (int64_t j = lo[i]; j < hi[i]; ++j) {  // the scores, as the one-row paths finish them
            float s = w[j] * p.scale;
            if (p.softcap > 0.f) s = std::tanh(s / p.softcap) * p.softcap;
            if (p.k_pos && !key_visible(p, qpos, (*p.k_pos)[static_cast<size_t>(j)])) s = neg_inf;
            w[j] = s;
            mx = std::max(mx, s);
          }
          live[i][h] = mx != neg_inf;  // else nothing visible: zeros rather than NaN
          total[i][h] = live[i][h] ? softmax_weights8(w, lo[i], hi[i], mx) : 0.f;
        }
      }
      std::fill(acc.begin(), acc.begin() + n * HN * io.Dv, 0.f);
      for (int64_t b0 = jmin; b0 < jmax; b0 += kPrefillKeyBlock) {  // weighted values, the same key blocks
        const int64_t b1 = std::min(jmax, b0 + kPrefillKeyBlock);
        for (int64_t i = 0; i < n; ++i) {
          const int64_t j_lo = std::max(b0, lo[i]), j_hi = std::min(b1, hi[i]);
          for (int h = 0; h < HN; ++h) {
            if (!live[i][h] || j_lo >= j_hi) continue;
            const float* w = row(i, h);
            float* a = acc.data() + (i * HN + h) * io.Dv;
            __m256 r[NV];
            for (int d = 0; d < NV; ++d) r[d] = _mm256_loadu_ps(a + 8 * d);
            for (int64_t j = j_lo; j < j_hi; ++j) {
              if (w[j] == 0.f) continue;
              const __m256 ve = _mm256_set1_ps(w[j]);
              const KT* vj = vbase + j * io.vs0;
              for (int d = 0; d < NV; ++d) r[d] = _mm256_fmadd_ps(ve, load8(vj + 8 * d), r[d]);
            }
            for (int d = 0; d < NV; ++d) _mm256_storeu_ps(a + 8 * d, r[d]);
          }
        }
      }
      for (int64_t i = 0; i < n; ++i)
        for (int h = 0; h < HN; ++h) {
          float* o = io.op + ((t0 + i) * io.Hq + h0 + h) * io.Dv;
          if (!live[i][h]) {
            std::fill(o, o + io.Dv, 0.f);
            continue;
          }
          const float inv = 1.0f / total[i][h];
          const float* a = acc.data() + (i * HN + h) * io.Dv;
          for (int64_t d = 0; d < io.Dv; ++d) o[d] = a[d] * inv;
        }
    }
  };
  parallel_for(blocks * per_row, 1, tasks, attention_chunks_per_thread(io.T));
}

// The blocked prefill for the head sizes the SIMD paths cover (head pairs where the GQA group is even).
template <class KT>
bool attention_prefill(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, Tensor& out) {
  if (q.dim(0) <= kAttentionDecodeRows) return false;
  const bool pairs = (q.dim(1) / k.dim(1)) % 2 == 0;
  switch (v.dim(2)) {
    case 32:
      pairs ? attention_prefill_blocks<KT, 2, 4>(q, k, v, p, out) : attention_prefill_blocks<KT, 1, 4>(q, k, v, p, out);
      return true;
    case 64:
      pairs ? attention_prefill_blocks<KT, 2, 8>(q, k, v, p, out) : attention_prefill_blocks<KT, 1, 8>(q, k, v, p, out);
      return true;
    case 128:
      pairs ? attention_prefill_blocks<KT, 2, 16>(q, k, v, p, out)
            : attention_prefill_blocks<KT, 1, 16>(q, k, v, p, out);
      return true;
    case 256:
      pairs ? attention_prefill_blocks<KT, 2, 32>(q, k, v, p, out)
            : attention_prefill_blocks<KT, 1, 32>(q, k, v, p, out);
      return true;
    default: return false;
  }
}
#endif

template <class KT>
void attention_impl(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, Tensor& out) {
  const Operands<KT> io(q, k, v, out);
#ifdef LATHE_AVX2
  if (attention_prefill<KT>(q, k, v, p, out)) return;
  if (io.group % 2 == 0) {
    if (io.Dv == 32) return attention_pairs<KT, 4>(q, k, v, p, out);
    if (io.Dv == 64) return attention_pairs<KT, 8>(q, k, v, p, out);
    if (io.Dv == 128) return attention_pairs<KT, 16>(q, k, v, p, out);
    if (io.Dv == 256) return attention_pairs<KT, 32>(q, k, v, p, out);
  }
#endif
  const float neg_inf = -std::numeric_limits<float>::infinity();

  auto key_pos = [&](int64_t j) { return p.k_pos ? (*p.k_pos)[static_cast<size_t>(j)] : p.k_pos0 + j; };
#ifdef LATHE_AVX2
  const bool prefetch = attention_prefetches(io.T);
#endif

  const auto tasks = [&](int64_t i0, int64_t i1) {
    std::vector<float> scores(static_cast<size_t>(io.S));
    std::vector<float> acc(static_cast<size_t>(io.Dv));
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / io.Hq, h = i % io.Hq, kh = h / io.group;
      const int64_t qpos = p.q_pos0 + t;
      const float* qv = io.qp + t * io.qs0 + h * io.qs1;
      // Visible key range for linear positions; explicit positions check every key.
      int64_t j0, j1;
      visible_key_range(p, qpos, io.S, j0, j1);
      float mx = neg_inf;
      int64_t jb = j0;
#ifdef LATHE_AVX2
      // Linear positions: every key in [j0, j1) is visible; score them four at a time.
      if (!p.k_pos) {
        for (; jb + 4 <= j1; jb += 4) {
          const KT* keys[4];
          for (int r = 0; r < 4; ++r) keys[r] = io.kp + (jb + r) * io.ks0 + kh * io.ks1;
          if (prefetch && jb + kKvPrefetchKeys + 4 <= j1)
            for (int r = 0; r < 4; ++r) prefetch_bytes(keys[r] + kKvPrefetchKeys * io.ks0, io.D * sizeof(KT));
          float d4[4];
          attn_dot_x4(qv, keys, io.D, d4);
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
        if (p.k_pos && !key_visible(p, qpos, key_pos(j))) {
          s = neg_inf;
        } else {
          s = dot_key(qv, io.kp + j * io.ks0 + kh * io.ks1, io.D) * p.scale;
          if (p.softcap > 0.f) s = std::tanh(s / p.softcap) * p.softcap;
        }
        scores[static_cast<size_t>(j)] = s;
        mx = std::max(mx, s);
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      float* o = io.op + (t * io.Hq + h) * io.Dv;
      if (mx == neg_inf) {  // nothing visible: zero output rather than NaN
        std::fill(o, o + io.Dv, 0.f);
        continue;
      }
#ifdef LATHE_AVX2
      const KT* vh = io.vp + kh * io.vs1;
      if (io.Dv == 32 || io.Dv == 64 || io.Dv == 128 || io.Dv == 256) {
        if (io.Dv == 32) attn_weighted_values<4>(scores.data(), j0, j1, mx, vh, io.vs0, prefetch, o);
        if (io.Dv == 64) attn_weighted_values<8>(scores.data(), j0, j1, mx, vh, io.vs0, prefetch, o);
        if (io.Dv == 128) attn_weighted_values<16>(scores.data(), j0, j1, mx, vh, io.vs0, prefetch, o);
        if (io.Dv == 256) attn_weighted_values<32>(scores.data(), j0, j1, mx, vh, io.vs0, prefetch, o);
        continue;
      }
#endif
      float sum = 0.f;
      for (int64_t j = j0; j < j1; ++j) {
        const float s = scores[static_cast<size_t>(j)];
        if (s == neg_inf) continue;
        const float e = std::exp(s - mx);
        sum += e;
        const KT* vj = io.vp + j * io.vs0 + kh * io.vs1;
        if constexpr (std::is_same_v<KT, float>) {
          axpy_f32(e, vj, acc.data(), io.Dv);
        } else {
          for (int64_t d = 0; d < io.Dv; ++d) acc[static_cast<size_t>(d)] += e * widen(vj[d]);
        }
      }
      const float inv = 1.0f / sum;
      for (int64_t d = 0; d < io.Dv; ++d) o[d] = acc[static_cast<size_t>(d)] * inv;
    }
  };
  parallel_for(io.T * io.Hq, 1, tasks, attention_chunks_per_thread(io.T));
}

}  // namespace f32_attn
}  // namespace

void attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, Tensor& out) {
  if (attention_avx512(q, k, v, p, out)) return;
  if (k.dtype() == DType::BF16 && v.dtype() == DType::BF16) {
    f32_attn::attention_impl<uint16_t>(q, k, v, p, out);
    return;
  }
  if (k.dtype() != DType::F32 || v.dtype() != DType::F32) {
    f32_attn::attention_impl<float>(q, k.contiguous().to(DType::F32), v.contiguous().to(DType::F32), p, out);
    return;
  }
  f32_attn::attention_impl<float>(q, k, v, p, out);
}

}  // namespace lathe::cpu
