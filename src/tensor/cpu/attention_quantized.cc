// Attention over MLX affine-quantized K/V (quantized KV caches), reading the codes where they lie: with
// w = scale·code + bias per group,
//   q·k = Σ_g scale_g · Σ_{i∈g} code_i·q_i + bias_g · Σ_{i∈g} q_i,
//   Σ_j e_j·v_j = Σ_j (e_j·scale_jg)·code_j + Σ_j e_j·bias_jg   (per group g of the value dims),
// so a step streams the 4- or 8-bit cache once instead of writing and re-reading an f32 copy of it (which made
// an 8-bit cache slower than an f32 one). Same visibility rules, softcap and empty-row zeros as attention();
// the sums round differently from the dequantized f32 path, within the quantization's own error. On AVX-512
// machines decode rows take attention_avx512.cc's kernel instead (codes turned into f32 16 at a time, both
// query heads of a GQA pair per key load: 8-bit K/V decode 1.5x, 4-bit 1.9x faster than this file's kernel at
// 4k tokens). Heads whose size the vector kernels do not cover (or CPUs without AVX2), and prefill chunks (many
// query rows, which share one dequantized copy better), dequantize and run the f32 kernel.
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

// q·k for one key row: per group an exact-order vector dot of codes with q, scaled into one accumulator.
template <int BITS, int NV>
float qk_dot(const float* q, const QRow& k, int gs, const float* qsum) {
  const int G = NV * 8 / gs;
  __m256 acc = _mm256_setzero_ps();
  float bias = 0.f;
  for (int g = 0; g < G; ++g) {
    __m256 dot = _mm256_setzero_ps();
    for (int i = g * gs; i < (g + 1) * gs; i += 8)
      dot = _mm256_fmadd_ps(codes8<BITS>(k.w, i), _mm256_loadu_ps(q + i), dot);
    acc = _mm256_fmadd_ps(dot, _mm256_set1_ps(k.s[g]), acc);
    bias = std::fma(k.b[g], qsum[g], bias);
  }
  return hsum(acc) + bias;
}

template <int BITS, int NV>
void attention_rows(const Tensor& q, const QuantizedMatrix& k, const QuantizedMatrix& v, int64_t Hkv,
                    const AttentionParams& p, Tensor& out) {
  constexpr int D = NV * 8;
  const int64_t T = q.dim(0), Hq = q.dim(1), S = k.rows() / Hkv;
  const int64_t group = Hq / Hkv;
  const int kgs = k.group_size, vgs = v.group_size;
  const float* qp = q.data<float>();
  const int64_t qs0 = q.stride(0), qs1 = q.stride(1);
  float* op = out.data<float>();
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const bool prefetch = attention_prefetches(T);
  constexpr int64_t kCodeBytes = D * BITS / 8;
  const auto tasks = [&](int64_t i0, int64_t i1) {
    std::vector<float> scores(static_cast<size_t>(S));
    float qsum[D / 8], vbias[D / 8];
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / Hq, h = i % Hq, kh = h / group;
      const int64_t qpos = p.q_pos0 + t;
      const float* qv = qp + t * qs0 + h * qs1;
      int64_t j0, j1;
      visible_key_range(p, qpos, S, j0, j1);
      for (int g = 0; g < D / kgs; ++g) {
        float s = 0.f;
        for (int e = g * kgs; e < (g + 1) * kgs; ++e) s += qv[e];
        qsum[g] = s;
      }
      float mx = neg_inf;
      for (int64_t j = j0; j < j1; ++j) {
        if (prefetch && j + kKvPrefetchKeys < j1) prefetch_qrow(qrow(k, (j + kKvPrefetchKeys) * Hkv + kh), kCodeBytes);
        float s = neg_inf;
        if (!p.k_pos || key_visible(p, qpos, (*p.k_pos)[static_cast<size_t>(j)])) {
          s = qk_dot<BITS, NV>(qv, qrow(k, j * Hkv + kh), kgs, qsum) * p.scale;
          if (p.softcap > 0.f) s = std::tanh(s / p.softcap) * p.softcap;
        }
        scores[static_cast<size_t>(j)] = s;
        mx = std::max(mx, s);
      }
      float* o = op + (t * Hq + h) * D;
      if (mx == neg_inf) {  // nothing visible: zero output rather than NaN
        std::fill(o, o + D, 0.f);
        continue;
      }
      __m256 acc[NV];
      for (int d = 0; d < NV; ++d) acc[d] = _mm256_setzero_ps();
      const int VG = D / vgs;
      std::fill(vbias, vbias + VG, 0.f);
      const float sum = softmax_weights8(scores.data(), j0, j1, mx);
      for (int64_t j = j0; j < j1; ++j) {
        const float e = scores[static_cast<size_t>(j)];
        if (e == 0.f) continue;
        const QRow vr = qrow(v, j * Hkv + kh);
        if (prefetch && j + kKvPrefetchKeys < j1) prefetch_qrow(qrow(v, (j + kKvPrefetchKeys) * Hkv + kh), kCodeBytes);
        for (int g = 0; g < VG; ++g) {
          const __m256 c = _mm256_set1_ps(e * vr.s[g]);
          for (int d = g * vgs / 8; d < (g + 1) * vgs / 8; ++d)
            acc[d] = _mm256_fmadd_ps(codes8<BITS>(vr.w, 8 * d), c, acc[d]);
          vbias[g] = std::fma(e, vr.b[g], vbias[g]);
        }
      }
      const float inv = 1.0f / sum;
      for (int d = 0; d < NV; ++d) {
        const __m256 b = _mm256_set1_ps(vbias[d * 8 / vgs]);
        _mm256_storeu_ps(o + 8 * d, _mm256_mul_ps(_mm256_add_ps(acc[d], b), _mm256_set1_ps(inv)));
      }
    }
  };
  parallel_for(T * Hq, 1, tasks, attention_chunks_per_thread(T));
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
