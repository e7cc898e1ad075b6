// Integer-dot matmul over packed MLX affine weights (layout and formula in packed_quant.h). Activations are
// quantized once per call, one row at a time; each output y[m, n] then runs the same instruction sequence
// (group by group into one accumulator, then the bias term, then one horizontal sum) whether the call has one
// row or many, so a row's result never depends on what else is in the batch. Tiles of NR weight rows × MR
// activation rows only share loads.
#include <algorithm>
#include <cmath>
#include <vector>

#include "tensor/cpu/cpu_features.h"
#include "tensor/cpu/packed_quant.h"
#include "tensor/thread_pool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LATHE_X86 1
#define LATHE_AVX2_FN __attribute__((target("avx2,fma,f16c")))
#endif

namespace lathe::cpu {
namespace {

// One quantized activation row: K int8 values, and per group its scale and the sum of its quantized values.
struct XRow {
  const int8_t* q;
  const float* d;
  const float* sum;
};

// The group sums of the quantized activations (d · Σ xq), not of x: the bias term then pairs with the same
// activations as the codes, so y is the exact dot of the dequantized weights with the quantized row and the
// activation rounding errors meet centred weights (with Σ x they would meet the uncentred codes 0..15).
void group_sums(const int8_t* q, int64_t K, int gs, const float* d, float* sum) {
  for (int64_t g = 0; g < K / gs; ++g) {
    int32_t s = 0;
    for (int i = 0; i < gs; ++i) s += q[g * gs + i];
    sum[g] = d[g] * static_cast<float>(s);
  }
}

void quantize_row_scalar(const float* x, int64_t K, int gs, int8_t* q, float* d, float* sum) {
  for (int64_t g = 0; g < K / gs; ++g) {
    const float* xg = x + g * gs;
    float amax = 0.f;
    for (int i = 0; i < gs; ++i) amax = std::max(amax, std::fabs(xg[i]));
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    d[g] = amax / 127.f;
    for (int i = 0; i < gs; ++i) q[g * gs + i] = static_cast<int8_t>(std::nearbyint(xg[i] * inv));
  }
  group_sums(q, K, gs, d, sum);
}

// The scalar kernel: exact int32 dots per group, then the same formula.
float dot_row_scalar(const PackedQuant& p, int64_t n, const XRow& x) {
  const uint8_t* w = p.codes.get() + n * p.row_bytes;
  const float* s = p.scales.data() + n * p.groups;
  const float* b = p.biases.data() + n * p.groups;
  const int gs = p.group_size;
  float acc = 0.f;
  for (int64_t g = 0; g < p.groups; ++g) {
    int32_t isum = 0;
    for (int i = 0; i < gs; ++i) {
      const int64_t k = g * gs + i;
      int code;
      if (p.bits == 4) {
        const uint8_t byte = w[(k / 64) * 32 + (k % 32)];
        code = (k % 64) < 32 ? (byte & 0xF) : (byte >> 4);
      } else {
        code = static_cast<int8_t>(w[k]);
      }
      isum += code * x.q[k];
    }
    acc += static_cast<float>(isum) * (s[g] * x.d[g]);
  }
  for (int64_t g = 0; g < p.groups; ++g) acc += b[g] * x.sum[g];
  return acc;
}

#ifdef LATHE_X86
LATHE_AVX2_FN inline float hsum8(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

LATHE_AVX2_FN void quantize_row_avx2(const float* x, int64_t K, int gs, int8_t* q, float* d, float* sum) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t g = 0; g < K / gs; ++g) {
    const float* xg = x + g * gs;
    __m256 vmax = _mm256_setzero_ps();
    for (int i = 0; i < gs; i += 8) vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, _mm256_loadu_ps(xg + i)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    d[g] = amax / 127.f;
    const __m256 vinv = _mm256_set1_ps(inv);
    for (int i = 0; i < gs; i += 32) {
      const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xg + i), vinv));
      const __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xg + i + 8), vinv));
      const __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xg + i + 16), vinv));
      const __m256i e = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xg + i + 24), vinv));
      const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, e));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + g * gs + i), _mm256_permutevar8x32_epi32(packed, order));
    }
  }
  group_sums(q, K, gs, d, sum);
}

// Σ over 32 codes × 32 activations as 8 int32 lanes: 4-bit codes are unsigned already.
LATHE_AVX2_FN inline __m256i dot4_half(__m256i codes, const int8_t* x) {
  return _mm256_maddubs_epi16(codes, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
}
// 8-bit codes are signed: |code| × (activation with the code's sign).
LATHE_AVX2_FN inline __m256i dot8_half(__m256i abs_codes, __m256i codes, const int8_t* x) {
  const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  return _mm256_madd_epi16(_mm256_maddubs_epi16(abs_codes, _mm256_sign_epi8(xv, codes)), _mm256_set1_epi16(1));
}

LATHE_AVX2_FN inline __m256 group_step(__m256 acc, __m256i isum, float s, float d) {
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(s * d), acc);
}

// Outputs for NR weight rows × MR activation rows: out[m * ldy + r].
template <int BITS, int GS, int NR, int MR>
LATHE_AVX2_FN void tile_avx2(const PackedQuant& p, int64_t n0, const XRow* x, float* out, int64_t ldy) {
  const int64_t G = p.groups;
  const uint8_t* w[NR];
  const float* s[NR];
  for (int r = 0; r < NR; ++r) {
    w[r] = p.codes.get() + (n0 + r) * p.row_bytes;
    s[r] = p.scales.data() + (n0 + r) * G;
  }
  __m256 acc[NR][MR];
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) acc[r][m] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1), low = _mm256_set1_epi8(0x0F);
  if constexpr (BITS == 4) {
    for (int64_t u = 0; u < p.cols / 64; ++u) {  // one 32-byte unit: 64 elements
      for (int r = 0; r < NR; ++r) {
        // Decode is bound by weight loads: ask for each row's bytes 1 KiB ahead of use.
        _mm_prefetch(reinterpret_cast<const char*>(w[r] + u * 32 + 1024), _MM_HINT_T0);
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + u * 32));
        const __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        for (int m = 0; m < MR; ++m) {
          const int8_t* xk = x[m].q + u * 64;
          const __m256i a = dot4_half(lo, xk), b = dot4_half(hi, xk + 32);
          if constexpr (GS == 32) {  // the unit is two groups
            acc[r][m] = group_step(acc[r][m], _mm256_madd_epi16(a, ones), s[r][2 * u], x[m].d[2 * u]);
            acc[r][m] = group_step(acc[r][m], _mm256_madd_epi16(b, ones), s[r][2 * u + 1], x[m].d[2 * u + 1]);
          } else if constexpr (GS == 64) {
            acc[r][m] = group_step(acc[r][m], _mm256_madd_epi16(_mm256_add_epi16(a, b), ones), s[r][u], x[m].d[u]);
          } else {  // GS == 128: the unit is half a group; finish the group with the next unit
            const __m256i v2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + u * 32 + 32));
            const __m256i lo2 = _mm256_and_si256(v2, low), hi2 = _mm256_and_si256(_mm256_srli_epi16(v2, 4), low);
            const __m256i c = dot4_half(lo2, xk + 64), e = dot4_half(hi2, xk + 96);
            const __m256i s16 = _mm256_add_epi16(_mm256_add_epi16(a, b), _mm256_add_epi16(c, e));
            acc[r][m] = group_step(acc[r][m], _mm256_madd_epi16(s16, ones), s[r][u / 2], x[m].d[u / 2]);
          }
        }
      }
      if constexpr (GS == 128) ++u;
    }
  } else {
    for (int64_t g = 0; g < G; ++g) {
      for (int r = 0; r < NR; ++r) {
        __m256i cv[GS / 32], av[GS / 32];
        for (int h = 0; h < GS / 32; ++h) {
          cv[h] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + g * GS + h * 32));
          av[h] = _mm256_abs_epi8(cv[h]);
        }
        for (int m = 0; m < MR; ++m) {
          const int8_t* xk = x[m].q + g * GS;
          __m256i isum = dot8_half(av[0], cv[0], xk);
          for (int h = 1; h < GS / 32; ++h) isum = _mm256_add_epi32(isum, dot8_half(av[h], cv[h], xk + h * 32));
          acc[r][m] = group_step(acc[r][m], isum, s[r][g], x[m].d[g]);
        }
      }
    }
  }
  // The bias term Σ_g bias·xsum joins the same accumulator, eight groups at a time; then one horizontal sum.
  for (int r = 0; r < NR; ++r) {
    const float* b = p.biases.data() + (n0 + r) * G;
    for (int m = 0; m < MR; ++m) {
      __m256 a = acc[r][m];
      int64_t g = 0;
      for (; g + 8 <= G; g += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(b + g), _mm256_loadu_ps(x[m].sum + g), a);
      float tail = 0.f;
      for (; g < G; ++g) tail += b[g] * x[m].sum[g];
      out[m * ldy + r] = hsum8(a) + tail;
    }
  }
}

template <int BITS, int GS>
void rows_avx2(const PackedQuant& p, int64_t n0, int64_t n1, const std::vector<XRow>& x, int64_t row0, float* y,
               int64_t ldy) {
  const int64_t M = static_cast<int64_t>(x.size());
  if (M == 1) {  // decode: four weight rows share each activation load
    int64_t n = n0;
    for (; n + 4 <= n1; n += 4) tile_avx2<BITS, GS, 4, 1>(p, n, x.data(), y + (n - row0), ldy);
    for (; n < n1; ++n) tile_avx2<BITS, GS, 1, 1>(p, n, x.data(), y + (n - row0), ldy);
    return;
  }
  // Prefill: four weight rows stay in L1 while the activation rows stream past them two at a time.
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) {
    int64_t m = 0;
    for (; m + 2 <= M; m += 2) tile_avx2<BITS, GS, 4, 2>(p, n, x.data() + m, y + m * ldy + (n - row0), ldy);
    for (; m < M; ++m) tile_avx2<BITS, GS, 4, 1>(p, n, x.data() + m, y + m * ldy + (n - row0), ldy);
  }
  for (; n < n1; ++n)
    for (int64_t m = 0; m < M; ++m) tile_avx2<BITS, GS, 1, 1>(p, n, x.data() + m, y + m * ldy + (n - row0), ldy);
}

using RowsFn = void (*)(const PackedQuant&, int64_t, int64_t, const std::vector<XRow>&, int64_t, float*, int64_t);

RowsFn pick_avx2(int bits, int gs) {
  if (bits == 4) return gs == 32 ? rows_avx2<4, 32> : gs == 64 ? rows_avx2<4, 64> : rows_avx2<4, 128>;
  return gs == 32 ? rows_avx2<8, 32> : gs == 64 ? rows_avx2<8, 64> : rows_avx2<8, 128>;
}
#endif

// Per-thread activation buffers, reused across calls.
struct Scratch {
  std::vector<int8_t> q;
  std::vector<float> d, sum;
  std::vector<XRow> rows;
};

}  // namespace

void linear_packed(const float* x, int64_t M, const PackedQuant& p, int64_t row0, int64_t N, float* y) {
  const int64_t K = p.cols, G = p.groups;
  const Isa isa = active_isa();
  thread_local Scratch sc;
  sc.q.resize(static_cast<size_t>(M * K));
  sc.d.resize(static_cast<size_t>(M * G));
  sc.sum.resize(static_cast<size_t>(M * G));
  sc.rows.resize(static_cast<size_t>(M));
  int8_t* qb = sc.q.data();
  float* db = sc.d.data();
  float* sb = sc.sum.data();
  parallel_for(M, 4, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
#ifdef LATHE_X86
      if (isa == Isa::Avx2) {
        quantize_row_avx2(x + m * K, K, p.group_size, qb + m * K, db + m * G, sb + m * G);
        continue;
      }
#endif
      quantize_row_scalar(x + m * K, K, p.group_size, qb + m * K, db + m * G, sb + m * G);
    }
  });
  for (int64_t m = 0; m < M; ++m) sc.rows[static_cast<size_t>(m)] = XRow{qb + m * K, db + m * G, sb + m * G};
  const std::vector<XRow>& rows = sc.rows;
  const int64_t r0 = row0;
#ifdef LATHE_X86
  if (isa == Isa::Avx2) {
    const RowsFn fn = pick_avx2(p.bits, p.group_size);
    parallel_for(N, 16, [&](int64_t a, int64_t b) { fn(p, r0 + a, r0 + b, rows, r0, y, N); });
    return;
  }
#endif
  parallel_for(N, 16, [&](int64_t a, int64_t b) {
    for (int64_t n = r0 + a; n < r0 + b; ++n)
      for (int64_t m = 0; m < M; ++m) y[m * N + (n - r0)] = dot_row_scalar(p, n, rows[static_cast<size_t>(m)]);
  });
}

}  // namespace lathe::cpu
