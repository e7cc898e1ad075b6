// Attention over MLX affine-quantized K/V (quantized KV caches), reading the codes where they lie: with
// w = scale·code + bias per group,
//   q·k = Σ_g scale_g · Σ_{i∈g} code_i·q_i + bias_g · Σ_{i∈g} q_i,
//   Σ_j e_j·v_j = Σ_j (e_j·scale_jg)·code_j + Σ_j e_j·bias_jg   (per group g of the value dims),
// so a step streams the 4- or 8-bit cache once instead of writing and re-reading an f32 copy of it (which made
// an 8-bit cache slower than an f32 one). Same visibility rules, softcap and empty-row zeros as attention();
// the sums round differently from the dequantized f32 path, within the quantization's own error. On AVX-512
// machines decode rows take attention_avx512.cc's kernel instead (codes turned into f32 16 at a time, both
// query heads of a GQA pair per key load: 8-bit K/V decode 1.5x, 4-bit 1.9x faster than this file's kernel at
// 4k tokens). This file's kernel gives a task both heads of a GQA pair, so each K and V row's codes are loaded
// and converted once for both (8-bit K/V decode at 4k tokens on AVX2: 32.3 -> 40.7-42.4 tok/s). Heads whose size
// the vector kernels do not cover (or CPUs without AVX2), and prefill chunks on AVX2 (many query rows, which share
// one dequantized copy better), dequantize and run the f32 kernel.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "tensor/cpu/kernels.h"
#include "tensor/cpu/simd.h"
#include "tensor/thread_pool.h"

namespace lathe::cpu {
namespace {
namespace qkv_attn {  // (a namespace of its own: unity builds merge the anonymous namespaces of several files)

Tensor dequantize_all(const QuantizedMatrix& m, int64_t kv_heads) {
  const int64_t rows = m.rows(), cols = m.cols();
  Tensor out = Tensor::empty({rows / kv_heads, kv_heads, cols}, DType::F32);
  float* o = out.data<float>();
  parallel_for(rows, 64, [&](int64_t r0, int64_t r1) { dequantize_rows(m, r0, r1 - r0, o + r0 * cols); });
  return out;
}

#ifdef LATHE_AVX2
// Eight codes of one row from element i (a multiple of 8) as f32.
template <int BITS>
inline __m256 codes8(const uint32_t* words, int64_t i) {
  if constexpr (BITS == 8) {
    // Element k is byte k (little-endian words).
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(reinterpret_cast<const uint8_t*>(words) + i));
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
  } else {
    const __m256i w = _mm256_set1_epi32(static_cast<int>(words[i / 8]));  // element 8u + j at bits 4j of word u
    const __m256i nib =
        _mm256_and_si256(_mm256_srlv_epi32(w, _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)), _mm256_set1_epi32(0xF));
    return _mm256_cvtepi32_ps(nib);
  }
}

// One quantized row's view: codes, and f32 scales and biases per group.
struct QRow {
  const uint32_t* w;
  const float* s;
  const float* b;
};

// A decode row's K/V rows kKvPrefetchKeys ahead (kernels.h): codes, scales and biases.
inline void prefetch_qrow(const QRow& r, int64_t code_bytes) {
  prefetch_bytes(r.w, code_bytes);
  prefetch_bytes(r.s, 1);
  prefetch_bytes(r.b, 1);
}

inline QRow qrow(const QuantizedMatrix& m, int64_t r) {
  return {m.w.data<uint32_t>() + r * m.w.stride(0), m.scales.data<float>() + r * m.scales.stride(0),
          m.biases.data<float>() + r * m.biases.stride(0)};
}

// q·k of HN query heads with one key row: per group an exact-order vector dot of codes with each q, scaled into
// one accumulator per head; the codes are loaded and converted once for all HN heads.
template <int BITS, int NV, int HN>
void qk_dots(const float* const* q, const QRow& k, int gs, const float (*qsum)[NV], float* out) {
  const int G = NV * 8 / gs;
  __m256 acc[HN];
  float bias[HN];
  for (int h = 0; h < HN; ++h) acc[h] = _mm256_setzero_ps(), bias[h] = 0.f;
  for (int g = 0; g < G; ++g) {
    __m256 dot[HN];
    for (int h = 0; h < HN; ++h) dot[h] = _mm256_setzero_ps();
    for (int i = g * gs; i < (g + 1) * gs; i += 8) {
      const __m256 c = codes8<BITS>(k.w, i);
      for (int h = 0; h < HN; ++h) dot[h] = _mm256_fmadd_ps(c, _mm256_loadu_ps(q[h] + i), dot[h]);
    }
    const __m256 sg = _mm256_set1_ps(k.s[g]);
    for (int h = 0; h < HN; ++h) {
      acc[h] = _mm256_fmadd_ps(dot[h], sg, acc[h]);
      bias[h] = std::fma(k.b[g], qsum[h][g], bias[h]);
    }
  }
  for (int h = 0; h < HN; ++h) out[h] = hsum(acc[h]) + bias[h];
}

// One task: query row t, heads h0 .. h0 + HN − 1 (one KV head: a GQA pair shares each K and V row's loads).
template <int BITS, int NV, int HN>
void run_heads(const Tensor& q, const QuantizedMatrix& k, const QuantizedMatrix& v, int64_t Hkv,
               const AttentionParams& p, Tensor& out, int64_t t, int64_t h0, float* scores, bool prefetch) {
  constexpr int D = NV * 8;
  constexpr int64_t kCodeBytes = D * BITS / 8;
  const int64_t Hq = q.dim(1), S = k.rows() / Hkv, kh = h0 / (Hq / Hkv);
  const int kgs = k.group_size, vgs = v.group_size;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const int64_t qpos = p.q_pos0 + t;
  const float* qv[HN];
  float qsum[HN][NV];  // per head, the sum of q over each K group (at most NV groups: groups are ≥ 8 wide)
  for (int h = 0; h < HN; ++h) {
    qv[h] = q.data<float>() + t * q.stride(0) + (h0 + h) * q.stride(1);
    for (int g = 0; g < D / kgs; ++g) {
      float sum = 0.f;
      for (int e = g * kgs; e < (g + 1) * kgs; ++e) sum += qv[h][e];
      qsum[h][g] = sum;
    }
  }
  int64_t j0, j1;
  visible_key_range(p, qpos, S, j0, j1);
  float mx[HN];
  for (int h = 0; h < HN; ++h) mx[h] = neg_inf;
  for (int64_t j = j0; j < j1; ++j) {
    if (prefetch && j + kKvPrefetchKeys < j1) prefetch_qrow(qrow(k, (j + kKvPrefetchKeys) * Hkv + kh), kCodeBytes);
    float d[HN];
    const bool visible = !p.k_pos || key_visible(p, qpos, (*p.k_pos)[static_cast<size_t>(j)]);
    if (visible) qk_dots<BITS, NV, HN>(qv, qrow(k, j * Hkv + kh), kgs, qsum, d);
    for (int h = 0; h < HN; ++h) {
      float sc = neg_inf;
      if (visible) {
        sc = d[h] * p.scale;
        if (p.softcap > 0.f) sc = std::tanh(sc / p.softcap) * p.softcap;
      }
      scores[h * S + j] = sc;
      mx[h] = std::max(mx[h], sc);
    }
  }
  float* o[HN];
  float sum[HN];
  __m256 acc[HN][NV];
  float vbias[HN][NV];
  const int VG = D / vgs;
  for (int h = 0; h < HN; ++h) {
    o[h] = out.data<float>() + (t * Hq + h0 + h) * D;
    sum[h] = mx[h] == neg_inf ? 0.f : softmax_weights8(scores + h * S, j0, j1, mx[h]);
    if (mx[h] == neg_inf) std::fill(scores + h * S + j0, scores + h * S + j1, 0.f);  // nothing visible: zeros
    for (int d = 0; d < NV; ++d) acc[h][d] = _mm256_setzero_ps();
    std::fill(vbias[h], vbias[h] + VG, 0.f);
  }
  for (int64_t j = j0; j < j1; ++j) {
    float e[HN];
    bool any = false;
    for (int h = 0; h < HN; ++h) any |= (e[h] = scores[h * S + j]) != 0.f;
    if (!any) continue;
    const QRow vr = qrow(v, j * Hkv + kh);
    if (prefetch && j + kKvPrefetchKeys < j1) prefetch_qrow(qrow(v, (j + kKvPrefetchKeys) * Hkv + kh), kCodeBytes);
    for (int g = 0; g < VG; ++g) {
      for (int d = g * vgs / 8; d < (g + 1) * vgs / 8; ++d) {
        const __m256 c = codes8<BITS>(vr.w, 8 * d);
        for (int h = 0; h < HN; ++h)
          if (e[h] != 0.f) acc[h][d] = _mm256_fmadd_ps(c, _mm256_set1_ps(e[h] * vr.s[g]), acc[h][d]);
      }
      for (int h = 0; h < HN; ++h)
        if (e[h] != 0.f) vbias[h][g] = std::fma(e[h], vr.b[g], vbias[h][g]);
    }
  }
  for (int h = 0; h < HN; ++h) {
    if (mx[h] == neg_inf) {  // nothing visible: zero output rather than NaN
      std::fill(o[h], o[h] + D, 0.f);
      continue;
    }
    const float inv = 1.0f / sum[h];
    for (int d = 0; d < NV; ++d) {
      const __m256 b = _mm256_set1_ps(vbias[h][d * 8 / vgs]);
      _mm256_storeu_ps(o[h] + 8 * d, _mm256_mul_ps(_mm256_add_ps(acc[h][d], b), _mm256_set1_ps(inv)));
    }
  }
}

template <int BITS, int NV>
void attention_rows(const Tensor& q, const QuantizedMatrix& k, const QuantizedMatrix& v, int64_t Hkv,
                    const AttentionParams& p, Tensor& out) {
  const int64_t T = q.dim(0), Hq = q.dim(1), S = k.rows() / Hkv;
  const bool prefetch = attention_prefetches(T);
  const int64_t HN = (Hq / Hkv) % 2 == 0 ? 2 : 1, per_row = Hq / HN;
  const auto tasks = [&](int64_t i0, int64_t i1) {
    std::vector<float> scores(static_cast<size_t>(HN * S));
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / per_row, h0 = (i % per_row) * HN;
      if (HN == 2)
        run_heads<BITS, NV, 2>(q, k, v, Hkv, p, out, t, h0, scores.data(), prefetch);
      else
        run_heads<BITS, NV, 1>(q, k, v, Hkv, p, out, t, h0, scores.data(), prefetch);
    }
  };
  parallel_for(T * per_row, 1, tasks, attention_chunks_per_thread(T));
}

using RowsFn = void (*)(const Tensor&, const QuantizedMatrix&, const QuantizedMatrix&, int64_t, const AttentionParams&,
                        Tensor&);

template <int BITS>
RowsFn pick_for_bits(int64_t D) {
  switch (D) {
    case 32: return attention_rows<BITS, 4>;
    case 64: return attention_rows<BITS, 8>;
    case 128: return attention_rows<BITS, 16>;
    case 256: return attention_rows<BITS, 32>;
    default: return nullptr;
  }
}
#endif

}  // namespace qkv_attn
}  // namespace

void attention_quantized(const Tensor& q, const QuantizedMatrix& k, const QuantizedMatrix& v, int64_t kv_heads,
                         const AttentionParams& p, Tensor& out) {
  // Decode rows stream the codes once per step (a quarter / half of bf16's bytes); prefill chunks dequantize each
  // key block once per query block into a small f32 tile (no copy of the whole cache per chunk).
  if (attention_quantized_avx512(q, k, v, kv_heads, p, out)) return;
#ifdef LATHE_AVX2
  // Decode reads each key once per query row; a prefill chunk's many rows would convert every code once per
  // row, so it pays to dequantize once and share the f32 copy across them.
  constexpr int64_t kMaxFusedRows = 3;
  const int64_t D = q.dim(2);
  const bool covered = q.dim(0) <= kMaxFusedRows && k.bits == v.bits && (k.bits == 4 || k.bits == 8) && k.cols() == D &&
                       v.cols() == D && k.scales.dtype() == DType::F32 && k.biases.dtype() == DType::F32 &&
                       v.scales.dtype() == DType::F32 && v.biases.dtype() == DType::F32 && k.group_size % 8 == 0 &&
                       v.group_size % 8 == 0 && D % k.group_size == 0 && D % v.group_size == 0 && k.w.stride(1) == 1 &&
                       v.w.stride(1) == 1 && k.scales.stride(1) == 1 && v.scales.stride(1) == 1 &&
                       k.biases.stride(1) == 1 && v.biases.stride(1) == 1;
  if (const qkv_attn::RowsFn fn =
          covered ? (k.bits == 8 ? qkv_attn::pick_for_bits<8>(D) : qkv_attn::pick_for_bits<4>(D)) : nullptr) {
    fn(q, k, v, kv_heads, p, out);
    return;
  }
#endif
  const Tensor kf = qkv_attn::dequantize_all(k, kv_heads);
  const Tensor vf = qkv_attn::dequantize_all(v, kv_heads);
  attention(q, kf, vf, p, out);
}

}  // namespace lathe::cpu
