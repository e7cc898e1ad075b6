// Softmax attention on 512-bit registers, for CPUs with AVX-512 (chosen at run time; the binary's baseline is
// AVX2). Decode at long contexts is bound by the arithmetic over the cache (a dot product per key and head,
// then a weighted sum of value rows), and 16 lanes halve the instructions of both. Same semantics as
// attention.cc (GQA, causal / window / explicit positions, softcap, zeros where nothing is visible), over f32
// or bf16 K/V. Each (head, key) score is one FMA chain over the head dimension and one fixed reduction, whether
// the key is scored in a block of four or alone and whichever head shares the task, so a row's result does not
// depend on the batch or on the blocking; it differs from the AVX2 kernels' summation order (within rounding).
// The same kernel reads MLX-quantized K/V (quantized KV caches) in place: a row source turns 16 codes at a time
// into f32 (code·scale + bias of their group) where the plain sources load 16 values, so 8-bit (4-bit) K/V stream
// half (a quarter) of bf16's bytes through the same GQA sharing, key blocking and vector softmax.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "tensor/cpu/cpu_features.h"
#include "tensor/cpu/kernels.h"
#include "tensor/cpu/simd.h"
#include "tensor/thread_pool.h"

#include "tensor/cpu/simd512.h"

namespace lathe::cpu {
namespace {
namespace a512 {  // (a namespace of its own: unity builds merge the anonymous namespaces of several files)

#ifdef LATHE_A512
LATHE_A512 inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
LATHE_A512 inline __m512 load16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  // Full-mask zeroing forms: GCC 12's plain ones pass a self-initialized "undefined" vector that
  // -Wmaybe-uninitialized reports once inlined; the all-ones mask makes them the same instructions.
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, _mm512_maskz_cvtepu16_epi32(0xFFFF, h), 16));
}

// Row sources: row(j) is key (or value) j of one KV head, load(row, i) its values [i, i + 16) as f32 (i a multiple
// of 16), prefetch(row, d) brings in a row of d values.
// f32 or bf16 rows of a [S, Hkv, D] tensor.
template <class KT>
struct PlainRows {
  const KT* base;
  int64_t s0, s1;  // token and head strides (elements)
  int64_t j0 = 0;  // the token at base (a tile of rows from j0 on)
  static constexpr bool kTiled = false;
  using Row = const KT*;
  PlainRows head(int64_t kh) const { return {base + kh * s1, s0, s1, j0}; }
  Row row(int64_t j) const { return base + (j - j0) * s0; }
  LATHE_A512 static __m512 load(Row r, int64_t i) {
    __m512 x = load16(r + i);
    // An f32 row (an f32 cache, or a quantized cache's dequantized tile) must stay in a register: GCC would fold
    // the load into each head's FMA, two loads per value where the bf16 form has one, and at 4k tokens that made
    // 8-bit K/V prefill load-bound (205-225 -> 245-296 tok/s, 0.6B, 2 threads; bf16 K/V 262-307).
    if constexpr (std::is_same_v<KT, float>) asm("" : "+v"(x));
    return x;
  }
  static void prefetch(Row r, int64_t d) { prefetch_bytes(r, d * static_cast<int64_t>(sizeof(KT))); }
};

// MLX affine codes (rows token·Hkv + head) with f32 scales and biases per group of 2^gs_shift values (≥ 16, so
// 16 values never straddle a group; a shift, not a division, per 16 values): value = code · scale + bias, one FMA.
template <int BITS>
struct QuantRows {
  const uint8_t* codes;
  const float *s, *b;
  int64_t c0, c1, g0, g1;  // token and head strides: code bytes, groups
  int gs_shift;
  // A prefill's query block reads each key block many times: it is dequantized once into an f32 tile first.
  static constexpr bool kTiled = true;
  struct Row {
    const uint8_t* c;
    const float *s, *b;
    int gs_shift;
  };
  QuantRows head(int64_t kh) const { return {codes + kh * c1, s + kh * g1, b + kh * g1, c0, c1, g0, g1, gs_shift}; }
  Row row(int64_t j) const { return {codes + j * c0, s + j * g0, b + j * g0, gs_shift}; }
  LATHE_A512 static __m512 load(const Row& r, int64_t i) {
    __m128i bytes;
    if constexpr (BITS == 8) {
      bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r.c + i));
    } else {  // value 2k is the low nibble of byte k, value 2k + 1 its high nibble
      const __m128i packed = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(r.c + i / 2));
      const __m128i nib = _mm_set1_epi8(0x0F);
      bytes = _mm_unpacklo_epi8(_mm_and_si128(packed, nib), _mm_and_si128(_mm_srli_epi16(packed, 4), nib));
    }
    const __m512 code = _mm512_maskz_cvtepi32_ps(0xFFFF, _mm512_maskz_cvtepu8_epi32(0xFFFF, bytes));  // see load16
    const int64_t g = i >> r.gs_shift;
    return _mm512_fmadd_ps(code, _mm512_set1_ps(r.s[g]), _mm512_set1_ps(r.b[g]));
  }
  static void prefetch(const Row& r, int64_t d) {
    prefetch_bytes(r.c, d * BITS / 8);
    prefetch_bytes(r.s, 1);
    prefetch_bytes(r.b, 1);
  }
  // Rows [j0, j1) of d values into tile [j1 − j0, d], the values load() gives.
  LATHE_A512 void dequantize(int64_t j0, int64_t j1, int64_t d, float* tile) const {
    for (int64_t j = j0; j < j1; ++j) {
      const Row r = row(j);
      for (int64_t i = 0; i < d; i += 16) _mm512_storeu_ps(tile + (j - j0) * d + i, load(r, i));
    }
  }
};

template <class Rows>
struct Inputs {
  const float* q;
  int64_t qs0, qs1;
  Rows k, v;
  float* out;
  int64_t T, Hq, S, group, D, Dv;
  const AttentionParams* p;
};

// reduce16 of eight vectors at once (full-mask shuffles: see load16), each sum in exactly reduce16's order (lane i +
// i+8, then + i+4, then 0+2 / 1+3, then the pair), so a key's score does not depend on whether it was reduced here or
// alone: the vectors are folded together level by level (two per register, then four, then eight) instead of one by
// one.
LATHE_A512 inline __m512 reduce8(const __m512* v) {
  __m512 t[4];
  for (int i = 0; i < 4; ++i)  // [v2i: s8 | v2i+1: s8], s8[j] = v[j] + v[j + 8]
    t[i] = _mm512_add_ps(_mm512_maskz_shuffle_f32x4(0xFFFF, v[2 * i], v[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_maskz_shuffle_f32x4(0xFFFF, v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  __m512 u[2];
  for (int i = 0; i < 2; ++i)  // 128-bit chunk k: s4 of v[4i + k], s4[j] = s8[j] + s8[j + 4]
    u[i] = _mm512_add_ps(_mm512_maskz_shuffle_f32x4(0xFFFF, t[2 * i], t[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_maskz_shuffle_f32x4(0xFFFF, t[2 * i], t[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  // Chunk k: [s4[0] + s4[2], s4[1] + s4[3]] of v[k], then the same of v[4 + k].
  const __m512 w = _mm512_add_ps(_mm512_shuffle_ps(u[0], u[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_ps(u[0], u[1], _MM_SHUFFLE(3, 2, 3, 2)));
  // Chunk k: [sum of v[k], sum of v[4 + k], (the same twice)].
  const __m512 z =
      _mm512_add_ps(_mm512_shuffle_ps(w, w, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_ps(w, w, _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_maskz_permutexvar_ps(0xFFFF, order, z);  // the eight sums in lanes 0-7
}

// Raw dot products of HN query heads with R consecutive keys (rows k[r]), left as 16-lane partial sums.
template <class Rows, int HN, int R>
LATHE_A512 inline void dot_sums(const float* const* q, const typename Rows::Row* k, int64_t D, __m512 (&acc)[HN][R]) {
  for (int h = 0; h < HN; ++h)
    for (int r = 0; r < R; ++r) acc[h][r] = _mm512_setzero_ps();
  for (int64_t i = 0; i < D; i += 16) {
    __m512 kv[R];
    for (int r = 0; r < R; ++r) kv[r] = Rows::load(k[r], i);
    for (int h = 0; h < HN; ++h) {
      const __m512 qv = _mm512_loadu_ps(q[h] + i);
      for (int r = 0; r < R; ++r) acc[h][r] = _mm512_fmadd_ps(qv, kv[r], acc[h][r]);
    }
  }
}

// exp(x) for x ≤ 0 (scores minus their maximum), 16 lanes (exp_poly in simd.h). −inf (a masked key) gives
// exactly 0.
LATHE_A512 inline __m512 exp_nonpositive(__m512 x) {
  using namespace exp_poly;
  const __mmask16 masked = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-std::numeric_limits<float>::infinity()), _CMP_EQ_OQ);
  x = _mm512_maskz_max_ps(0xFFFF, x, _mm512_set1_ps(-87.0f));  // full-mask forms: see load16
  const __m512 n = _mm512_maskz_roundscale_ps(0xFFFF, _mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 poly = _mm512_set1_ps(kCoef[0]);
  for (int i = 1; i < kTerms; ++i) poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(kCoef[i]));
  return _mm512_maskz_scalef_ps(static_cast<__mmask16>(~masked), poly, n);
}

// Turns scores[j0, j1) into their weights exp(s_j − mx), 16 at a time, in place; returns their sum.
LATHE_A512 inline float softmax_weights(float* scores, int64_t j0, int64_t j1, float mx) {
  const __m512 vmx = _mm512_set1_ps(mx);
  __m512 vsum = _mm512_setzero_ps();
  int64_t j = j0;
  for (; j + 16 <= j1; j += 16) {
    const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(scores + j), vmx));
    _mm512_storeu_ps(scores + j, e);
    vsum = _mm512_add_ps(vsum, e);
  }
  if (j < j1) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (j1 - j)) - 1);
    const __m512 e =
        _mm512_maskz_mov_ps(tail, exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, scores + j), vmx)));
    _mm512_mask_storeu_ps(scores + j, tail, e);
    vsum = _mm512_add_ps(vsum, e);
  }
  return reduce16(vsum);
}

// Turns raw dot products row[j0, j1) into scores in place (× scale, then softcap, then −inf where explicit
// positions hide the key), 16 at a time where no softcap or positions apply; returns their maximum. Each score
// is the same float operations whichever way it goes.
LATHE_A512 inline float finish_scores(float* row, int64_t j0, int64_t j1, const AttentionParams& p, int64_t qpos) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  if (p.softcap > 0.f || p.k_pos) {
    float mx = neg_inf;
    for (int64_t j = j0; j < j1; ++j) {
      float s = row[j] * p.scale;
      if (p.softcap > 0.f) s = std::tanh(s / p.softcap) * p.softcap;
      if (p.k_pos && !key_visible(p, qpos, (*p.k_pos)[static_cast<size_t>(j)])) s = neg_inf;
      row[j] = s;
      mx = std::max(mx, s);
    }
    return mx;
  }
  const __m512 scale = _mm512_set1_ps(p.scale);
  __m512 vmx = _mm512_set1_ps(neg_inf);
  int64_t j = j0;
  for (; j + 16 <= j1; j += 16) {
    const __m512 s = _mm512_mul_ps(_mm512_loadu_ps(row + j), scale);
    _mm512_storeu_ps(row + j, s);
    vmx = _mm512_maskz_max_ps(0xFFFF, vmx, s);  // full-mask form: see load16
  }
  alignas(64) float lanes[16];  // (not _mm512_reduce_max_ps: GCC 12 warns as for load16; max is exact in any order)
  _mm512_store_ps(lanes, vmx);
  float mx = neg_inf;
  for (const float l : lanes) mx = std::max(mx, l);
  for (; j < j1; ++j) mx = std::max(mx, row[j] *= p.scale);
  return mx;
}

// r[h] += w[h][j] · v_j over keys [j0, j1) in order, NV·16 values, each value row loaded once for all HN heads.
// A head skips a key whose weight is 0 (masked), so each head's sums are exactly those it would get alone;
// `dense` says no weight is 0 (linear positions: the exp never underflows to 0), and the same FMAs then run
// without the per-key tests.
template <class Rows, int NV, int HN>
LATHE_A512 inline void accumulate_values(const float* const* w, int64_t j0, int64_t j1, const Rows& v, bool prefetch,
                                         bool dense, __m512 (&r)[HN][NV]) {
  for (int64_t j = j0; j < j1; ++j) {
    float e[HN];
    bool any = false;
    for (int h = 0; h < HN; ++h) any |= (e[h] = w[h][j]) != 0.f;
    if (!dense && !any) continue;
    const typename Rows::Row vj = v.row(j);
    if (prefetch && j + kKvPrefetchKeys < j1) Rows::prefetch(v.row(j + kKvPrefetchKeys), 16 * NV);
    for (int d = 0; d < NV; ++d) {
      const __m512 vd = Rows::load(vj, 16 * d);
      for (int h = 0; h < HN; ++h)
        if (dense || e[h] != 0.f) r[h][d] = _mm512_fmadd_ps(_mm512_set1_ps(e[h]), vd, r[h][d]);
    }
  }
}

// o_h = Σ_j w_hj · v_j / Σ_j w_hj for HN query heads of one KV head (w = softmax_weights of each head's scores).
template <class Rows, int NV, int HN>
LATHE_A512 void weighted_values(float* const* scores, int64_t j0, int64_t j1, const float* mx, const Rows& v,
                                bool prefetch, bool dense, float* const* o) {
  float total[HN];
  for (int h = 0; h < HN; ++h) total[h] = softmax_weights(scores[h], j0, j1, mx[h]);
  __m512 acc[HN][NV];
  for (int h = 0; h < HN; ++h)
    for (int d = 0; d < NV; ++d) acc[h][d] = _mm512_setzero_ps();
  accumulate_values<Rows, NV, HN>(scores, j0, j1, v, prefetch, dense, acc);
  for (int h = 0; h < HN; ++h) {
    const __m512 inv = _mm512_set1_ps(1.0f / total[h]);
    for (int d = 0; d < NV; ++d) _mm512_storeu_ps(o[h] + 16 * d, _mm512_mul_ps(acc[h][d], inv));
  }
}

// Raw dot products of HN query heads with keys [j0, j1), four keys at a time, into row h of `scores` (stride S).
template <class Rows, int HN>
LATHE_A512 inline void score_keys(const float* const* q, const Rows& k, int64_t D, int64_t j0, int64_t j1,
                                  bool prefetch, float* scores, int64_t S) {
  using Row = typename Rows::Row;
  int64_t j = j0;
  for (; j + 4 <= j1; j += 4) {
    const Row keys[4] = {k.row(j), k.row(j + 1), k.row(j + 2), k.row(j + 3)};
    if (prefetch && j + kKvPrefetchKeys + 4 <= j1)
      for (int r = 0; r < 4; ++r) Rows::prefetch(k.row(j + r + kKvPrefetchKeys), D);
    __m512 acc[HN][4];
    dot_sums<Rows, HN, 4>(q, keys, D, acc);
    if constexpr (HN == 2) {
      // Both heads' four scores reduced together and stored as vectors: a masked store of the eight and scalar
      // reloads could not be forwarded (~20% of this function's time on Zen 5).
      const __m512 s = reduce8(&acc[0][0]);  // [head 0: keys j .. j + 3 | head 1: the same keys | ...]
      _mm_storeu_ps(scores + j, _mm512_maskz_extractf32x4_ps(0xF, s, 0));  // full-mask forms: see load16
      _mm_storeu_ps(scores + S + j, _mm512_maskz_extractf32x4_ps(0xF, s, 1));
    } else {
      for (int h = 0; h < HN; ++h)
        for (int r = 0; r < 4; ++r) scores[h * S + j + r] = reduce16(acc[h][r]);
    }
  }
  for (; j < j1; ++j) {
    const Row keys[1] = {k.row(j)};
    __m512 acc[HN][1];
    dot_sums<Rows, HN, 1>(q, keys, D, acc);
    for (int h = 0; h < HN; ++h) scores[h * S + j] = reduce16(acc[h][0]);
  }
}

// One task: query row t, heads h0 .. h0 + HN − 1 (one KV head). scores: HN rows of S floats.
template <class Rows, int HN, int NV>
LATHE_A512 void run_task(const Inputs<Rows>& a, int64_t t, int64_t h0, float* scores) {
  const AttentionParams& p = *a.p;
  const int64_t kh = h0 / a.group, S = a.S;
  const int64_t qpos = p.q_pos0 + t;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const float* q[HN];
  for (int h = 0; h < HN; ++h) q[h] = a.q + t * a.qs0 + (h0 + h) * a.qs1;
  int64_t j0, j1;
  visible_key_range(p, qpos, S, j0, j1);
  const bool prefetch = attention_prefetches(a.T), dense = !p.k_pos;
  score_keys<Rows, HN>(q, a.k.head(kh), a.D, j0, j1, prefetch, scores, S);
  float* sh[HN];
  float* o[HN];
  float mx[HN];
  bool all_visible = true;
  for (int h = 0; h < HN; ++h) {
    sh[h] = scores + h * S;
    o[h] = a.out + (t * a.Hq + h0 + h) * a.Dv;
    mx[h] = finish_scores(sh[h], j0, j1, p, qpos);
    all_visible &= mx[h] != neg_inf;
  }
  if constexpr (HN * NV <= 16) {  // the accumulators of all HN heads fit the 32 registers
    if (all_visible) {
      weighted_values<Rows, NV, HN>(sh, j0, j1, mx, a.v.head(kh), prefetch, dense, o);
      return;
    }
  }
  for (int h = 0; h < HN; ++h) {
    if (mx[h] == neg_inf) {  // nothing visible: zeros rather than NaN
      std::fill(o[h], o[h] + a.Dv, 0.f);
      continue;
    }
    weighted_values<Rows, NV, 1>(&sh[h], j0, j1, &mx[h], a.v.head(kh), prefetch, dense, &o[h]);
  }
}

// Prefill: a task takes kQueryBlock consecutive query rows of one head group and walks the keys in blocks of
// kKeyBlock, so each K and V row is read from memory once per query block and then from L1 by every query of
// it (one query at a time re-read the whole cache per row: at 2,048 tokens attention was 60% of the prefill).
// 16 rows a block rather than 8: quantized K/V dequantize each key block once per query block, and at 4k
// tokens 8-bit K/V prefill 272-277 -> 292-293 tok/s (bf16 K/V unchanged, 0.6B, 2 threads).
constexpr int64_t kQueryBlock = 16, kKeyBlock = 64;

// Query rows [t0, t1) (at most kQueryBlock), heads h0 .. h0 + HN − 1 of one KV head. Per query the same scores,
// the same softmax_weights from the same first key and the same FMA per value row in the same key order as
// run_task, so each query's output is bitwise what run_task gives it: a row's result does not depend on the
// block it is computed in. scores: kQueryBlock · HN rows of S floats; acc: kQueryBlock · HN · Dv floats.
template <class Rows, int HN, int NV>
LATHE_A512 void run_block_task(const Inputs<Rows>& a, int64_t t0, int64_t t1, int64_t h0, float* scores, float* acc,
                               float* tile) {
  const AttentionParams& p = *a.p;
  const int64_t kh = h0 / a.group, S = a.S, Dv = a.Dv, n = t1 - t0;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const Rows kbase = a.k.head(kh);
  const Rows vbase = a.v.head(kh);
  int64_t lo[kQueryBlock], hi[kQueryBlock], jmin = S, jmax = 0;
  const float* q[kQueryBlock][HN];
  for (int64_t i = 0; i < n; ++i) {
    visible_key_range(p, p.q_pos0 + t0 + i, S, lo[i], hi[i]);
    if (lo[i] < hi[i]) jmin = std::min(jmin, lo[i]), jmax = std::max(jmax, hi[i]);
    for (int h = 0; h < HN; ++h) q[i][h] = a.q + (t0 + i) * a.qs0 + (h0 + h) * a.qs1;
  }
  const auto row = [&](int64_t i, int h) { return scores + (i * HN + h) * S; };
  for (int64_t b0 = jmin; b0 < jmax; b0 += kKeyBlock) {  // scores, a key block at a time
    const int64_t b1 = std::min(jmax, b0 + kKeyBlock);
    if constexpr (Rows::kTiled) {
      kbase.dequantize(b0, b1, a.D, tile);
      const PlainRows<float> keys{tile, a.D, 0, b0};
      for (int64_t i = 0; i < n; ++i)
        score_keys<PlainRows<float>, HN>(q[i], keys, a.D, std::max(b0, lo[i]), std::min(b1, hi[i]), false, row(i, 0),
                                         S);
    } else {
      for (int64_t i = 0; i < n; ++i)
        score_keys<Rows, HN>(q[i], kbase, a.D, std::max(b0, lo[i]), std::min(b1, hi[i]), false, row(i, 0), S);
    }
  }
  float total[kQueryBlock][HN];
  bool live[kQueryBlock][HN];
  for (int64_t i = 0; i < n; ++i)
    for (int h = 0; h < HN; ++h) {
      float* w = row(i, h);
      const float mx = finish_scores(w, lo[i], hi[i], p, p.q_pos0 + t0 + i);
      live[i][h] = mx != neg_inf;  // else nothing visible: zeros rather than NaN, and no weight to add
      if (live[i][h])
        total[i][h] = softmax_weights(w, lo[i], hi[i], mx);
      else
        std::fill(w + lo[i], w + hi[i], 0.f);
    }
  std::fill(acc, acc + n * HN * Dv, 0.f);
  constexpr int HJ = HN * NV <= 16 ? HN : 1;  // heads summed in one pass over a value row (registers permitting)
  for (int64_t b0 = jmin; b0 < jmax; b0 += kKeyBlock) {  // weighted values, the same key blocks
    const int64_t b1 = std::min(jmax, b0 + kKeyBlock);
    if constexpr (Rows::kTiled) vbase.dequantize(b0, b1, Dv, tile);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t j_lo = std::max(b0, lo[i]), j_hi = std::min(b1, hi[i]);
      if (j_lo >= j_hi) continue;
      for (int hb = 0; hb < HN; hb += HJ) {
        __m512 r[HJ][NV];
        const float* w[HJ];
        bool dense = !p.k_pos;
        for (int h = 0; h < HJ; ++h) {
          w[h] = row(i, hb + h);
          dense &= live[i][hb + h];
          for (int d = 0; d < NV; ++d) r[h][d] = _mm512_loadu_ps(acc + (i * HN + hb + h) * Dv + 16 * d);
        }
        if constexpr (Rows::kTiled)
          accumulate_values<PlainRows<float>, NV, HJ>(w, j_lo, j_hi, {tile, Dv, 0, b0}, false, dense, r);
        else
          accumulate_values<Rows, NV, HJ>(w, j_lo, j_hi, vbase, false, dense, r);
        for (int h = 0; h < HJ; ++h)
          for (int d = 0; d < NV; ++d) _mm512_storeu_ps(acc + (i * HN + hb + h) * Dv + 16 * d, r[h][d]);
      }
    }
  }
  for (int64_t i = 0; i < n; ++i)
    for (int h = 0; h < HN; ++h) {
      float* o = a.out + ((t0 + i) * a.Hq + h0 + h) * Dv;
      if (!live[i][h]) {
        std::fill(o, o + Dv, 0.f);
        continue;
      }
      const __m512 inv = _mm512_set1_ps(1.0f / total[i][h]);
      const float* src = acc + (i * HN + h) * Dv;
      for (int d = 0; d < NV; ++d) _mm512_storeu_ps(o + 16 * d, _mm512_mul_ps(_mm512_loadu_ps(src + 16 * d), inv));
    }
}

template <class Rows, int HN, int NV>
void run_all(const Inputs<Rows>& a) {
  const int64_t per_row = a.Hq / HN;
  if (a.T > kAttentionDecodeRows) {
    const int64_t blocks = (a.T + kQueryBlock - 1) / kQueryBlock;
    const auto block_tasks = [&](int64_t i0, int64_t i1) {
      std::vector<float> scores(static_cast<size_t>(kQueryBlock * HN * a.S));
      std::vector<float> acc(static_cast<size_t>(kQueryBlock * HN * a.Dv));
      std::vector<float> tile(Rows::kTiled ? static_cast<size_t>(kKeyBlock * std::max(a.D, a.Dv)) : 0);
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t t0 = (i / per_row) * kQueryBlock;
        run_block_task<Rows, HN, NV>(a, t0, std::min(a.T, t0 + kQueryBlock), (i % per_row) * HN, scores.data(),
                                     acc.data(), tile.data());
      }
    };
    parallel_for(blocks * per_row, 1, block_tasks, attention_chunks_per_thread(a.T));
    return;
  }
  const auto tasks = [&](int64_t i0, int64_t i1) {
    std::vector<float> scores(static_cast<size_t>(HN * a.S));
    for (int64_t i = i0; i < i1; ++i) run_task<Rows, HN, NV>(a, i / per_row, (i % per_row) * HN, scores.data());
  };
  parallel_for(a.T * per_row, 1, tasks, attention_chunks_per_thread(a.T));
}

// Dispatch on the value head size and whether two query heads of one KV head share each task's key loads.
template <class Rows>
bool run_rows(Inputs<Rows>& a) {
  const bool pairs = a.group % 2 == 0;
  switch (a.Dv) {
    case 32: pairs ? run_all<Rows, 2, 2>(a) : run_all<Rows, 1, 2>(a); return true;
    case 64: pairs ? run_all<Rows, 2, 4>(a) : run_all<Rows, 1, 4>(a); return true;
    case 128: pairs ? run_all<Rows, 2, 8>(a) : run_all<Rows, 1, 8>(a); return true;
    case 256: pairs ? run_all<Rows, 2, 16>(a) : run_all<Rows, 1, 16>(a); return true;
    default: return false;
  }
}

template <class Rows>
Inputs<Rows> inputs(const Tensor& q, const AttentionParams& p, Tensor& out, int64_t S, int64_t Hkv, int64_t Dv) {
  Inputs<Rows> a{};
  a.q = q.data<float>();
  a.qs0 = q.stride(0);
  a.qs1 = q.stride(1);
  a.out = out.data<float>();
  a.p = &p;
  a.T = q.dim(0);
  a.Hq = q.dim(1);
  a.S = S;
  a.group = a.Hq / Hkv;
  a.D = q.dim(2);
  a.Dv = Dv;
  return a;
}

template <class KT>
bool run(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, Tensor& out) {
  Inputs<PlainRows<KT>> a = inputs<PlainRows<KT>>(q, p, out, k.dim(0), k.dim(1), v.dim(2));
  a.k = {k.data<KT>(), k.stride(0), k.stride(1)};
  a.v = {v.data<KT>(), v.stride(0), v.stride(1)};
  return run_rows(a);
}

template <int BITS>
QuantRows<BITS> quant_rows(const QuantizedMatrix& m, int64_t Hkv) {
  const int64_t c1 = m.w.stride(0) * 4, g1 = m.scales.stride(0);  // a row is one token's head
  return {reinterpret_cast<const uint8_t*>(m.w.data<uint32_t>()),
          m.scales.data<float>(),
          m.biases.data<float>(),
          Hkv * c1,
          c1,
          Hkv * g1,
          g1,
          __builtin_ctz(static_cast<unsigned>(m.group_size))};
}

template <int BITS>
bool run_quantized(const Tensor& q, const QuantizedMatrix& k, const QuantizedMatrix& v, int64_t Hkv,
                   const AttentionParams& p, Tensor& out) {
  Inputs<QuantRows<BITS>> a = inputs<QuantRows<BITS>>(q, p, out, k.rows() / Hkv, Hkv, v.cols());
  a.k = quant_rows<BITS>(k, Hkv);
  a.v = quant_rows<BITS>(v, Hkv);
  return run_rows(a);
}
#endif

}  // namespace a512
}  // namespace

bool attention_quantized_avx512(const Tensor& q, const QuantizedMatrix& k, const QuantizedMatrix& v, int64_t kv_heads,
                                const AttentionParams& p, Tensor& out) {
#ifdef LATHE_A512
  if (active_isa() != Isa::Avx512Vnni) return false;
  const auto rows_ok = [&](const QuantizedMatrix& m) {
    return m.bits == k.bits && m.w.stride(1) == 1 && m.scales.dtype() == DType::F32 && m.biases.dtype() == DType::F32 &&
           m.scales.stride(1) == 1 && m.biases.stride(1) == 1 && m.biases.stride(0) == m.scales.stride(0) &&
           m.group_size >= 16 && (m.group_size & (m.group_size - 1)) == 0 && m.cols() % m.group_size == 0;
  };
  if (q.dim(2) % 16 != 0 || q.stride(2) != 1 || k.cols() != q.dim(2) || !rows_ok(k) || !rows_ok(v)) return false;
  if (k.bits == 8) return a512::run_quantized<8>(q, k, v, kv_heads, p, out);
  if (k.bits == 4) return a512::run_quantized<4>(q, k, v, kv_heads, p, out);
#else
  (void)q, (void)k, (void)v, (void)kv_heads, (void)p, (void)out;
#endif
  return false;
}

bool attention_avx512(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, Tensor& out) {
#ifdef LATHE_A512
  if (active_isa() != Isa::Avx512Vnni) return false;
  if (q.dim(2) % 16 != 0 || q.stride(2) != 1 || k.stride(2) != 1 || v.stride(2) != 1) return false;
  if (k.dtype() != v.dtype()) return false;
  if (k.dtype() == DType::BF16) return a512::run<uint16_t>(q, k, v, p, out);
  if (k.dtype() == DType::F32) return a512::run<float>(q, k, v, p, out);
#else
  (void)q, (void)k, (void)v, (void)p, (void)out;
#endif
  return false;
}

}  // namespace lathe::cpu
