// Integer-dot matmul over packed MLX affine weights (layout and formula in packed_quant.h). Activations are
// quantized once per call, one row at a time; each output is then one fixed sequence of float steps over exact
// integer dots per group, whichever kernel runs and whatever the other rows of the call, so a row's result
// never depends on the batch nor on the ISA. The SIMD kernels (quantized_int8_tile.inc) hold one output row
// per register lane (16-row blocks); tiles of a block × MR activation rows share the weight loads.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "tensor/cpu/cpu_features.h"
#include "tensor/cpu/packed_quant.h"
#include "tensor/thread_pool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LATHE_X86 1
#define LATHE_AVX2_FN __attribute__((target("avx2,fma,f16c")))
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#define LATHE_NEON_DOT_FN __attribute__((target("arch=armv8.2-a+dotprod")))
#endif

namespace lathe::cpu {
namespace {

// One quantized activation row: K int8 values, and per group its scale d, the integer sum of its quantized
// values and xsum = d · that sum.
struct XRow {
  const int8_t* q;
  const float* d;
  const float* sum;
  const int32_t* qsum;
};

// The group sums of the quantized activations (d · Σ xq), not of x: the bias term then pairs with the same
// activations as the codes, so y is the exact dot of the dequantized weights with the quantized row and the
// activation rounding errors meet centred weights (with Σ x they would meet the uncentred codes 0..15).
void group_sums(const int8_t* q, int64_t K, int gs, const float* d, float* sum, int32_t* qsum) {
  for (int64_t g = 0; g < K / gs; ++g) {
    int32_t s = 0;
    for (int i = 0; i < gs; ++i) s += q[g * gs + i];
    qsum[g] = s;
    sum[g] = d[g] * static_cast<float>(s);
  }
}

void quantize_row_scalar(const float* x, int64_t K, int gs, int8_t* q, float* d, float* sum, int32_t* qsum) {
  for (int64_t g = 0; g < K / gs; ++g) {
    const float* xg = x + g * gs;
    float amax = 0.f;
    for (int i = 0; i < gs; ++i) amax = std::max(amax, std::fabs(xg[i]));
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    d[g] = amax / 127.f;
    for (int i = 0; i < gs; ++i) q[g * gs + i] = static_cast<int8_t>(std::nearbyint(xg[i] * inv));
  }
  group_sums(q, K, gs, d, sum, qsum);
}

// 16-bit activations as two int8 rows (packed_quant.h, act_bits): xq = nearest(x · 32512 / max|x|) per group,
// hi = nearest(xq / 255) and lo = xq − 255 · hi, both within ±127; hi's scale is 255 · d, lo's d. Integer
// arithmetic after the one rounding, so the split is exact.
void quantize_row_split(const float* x, int64_t K, int gs, int8_t* hi, float* dhi, float* shi, int32_t* ihi, int8_t* lo,
                        float* dlo, float* slo, int32_t* ilo) {
  constexpr float kLevels = 32512.f;  // 255 · 127 + 127: hi stays within ±127
  for (int64_t g = 0; g < K / gs; ++g) {
    const float* xg = x + g * gs;
    float amax = 0.f;
    for (int i = 0; i < gs; ++i) amax = std::max(amax, std::fabs(xg[i]));
    const float inv = amax > 0.f ? kLevels / amax : 0.f;
    dlo[g] = amax / kLevels;
    dhi[g] = dlo[g] * 255.f;
    for (int i = 0; i < gs; ++i) {
      const int32_t v = std::clamp(static_cast<int32_t>(std::nearbyint(xg[i] * inv)), -32512, 32512);
      const int32_t h = v >= 0 ? (v + 127) / 255 : -((127 - v) / 255);
      hi[g * gs + i] = static_cast<int8_t>(h);
      lo[g * gs + i] = static_cast<int8_t>(v - 255 * h);
    }
  }
  group_sums(hi, K, gs, dhi, shi, ihi);
  group_sums(lo, K, gs, dlo, slo, ilo);
}

// The scalar kernel: the same exact integer dots and the same float steps as the SIMD kernels.
float dot_row_scalar(const PackedQuant& p, int64_t n, const XRow& x) {
  const int gs = p.group_size;
  float acc = 0.f;
  for (int64_t g = 0; g < p.groups; ++g) {
    int32_t isum = 0;
    for (int i = 0; i < gs; ++i) isum += p.code(n, g * gs + i) * x.q[g * gs + i];
    const float sd = p.scale(n, g) * x.d[g];
    acc = std::fma(static_cast<float>(isum), sd, acc);
    acc = std::fma(p.bias(n, g), x.sum[g], acc);
  }
  return acc;
}

// Blocks [b0, b1) for M activation rows, writing y[M, N] for rows [row0, row0 + N) (the x86 SIMD kernels).
using RowsFn = void (*)(const PackedQuant&, int64_t, int64_t, const XRow*, int64_t, int64_t, int64_t, float*);

#ifdef LATHE_X86
// max |x| over one group (a multiple of 8 values).
LATHE_AVX2_FN float absmax_avx2(const float* xg, int gs) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 vmax = _mm256_setzero_ps();
  for (int i = 0; i < gs; i += 8) vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, _mm256_loadu_ps(xg + i)));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  return _mm_cvtss_f32(m4);
}

// 32 int32 values (in [−128, 127]) stored as 32 int8 in order.
LATHE_AVX2_FN void store_i8x32(int8_t* dst, __m256i a, __m256i b, __m256i c, __m256i e) {
  const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, e));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst),
                      _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

LATHE_AVX2_FN void quantize_row_avx2(const float* x, int64_t K, int gs, int8_t* q, float* d, float* sum,
                                     int32_t* qsum) {
  for (int64_t g = 0; g < K / gs; ++g) {
    const float* xg = x + g * gs;
    const float amax = absmax_avx2(xg, gs);
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    d[g] = amax / 127.f;
    const __m256 vinv = _mm256_set1_ps(inv);
    for (int i = 0; i < gs; i += 32) {
      const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xg + i), vinv));
      const __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xg + i + 8), vinv));
      const __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xg + i + 16), vinv));
      const __m256i e = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xg + i + 24), vinv));
      store_i8x32(q + g * gs + i, a, b, c, e);
    }
  }
  group_sums(q, K, gs, d, sum, qsum);
}

// quantize_row_split's integers with 8 lanes: the same product and rounding (round to nearest even, as
// nearbyint), and hi = round(v / 255) from a float product, exact here: |v| ≤ 32512 keeps v / 255 at least
// 0.5 / 255 away from any half, far beyond the product's error.
LATHE_AVX2_FN void quantize_row_split_avx2(const float* x, int64_t K, int gs, int8_t* hi, float* dhi, float* shi,
                                           int32_t* ihi, int8_t* lo, float* dlo, float* slo, int32_t* ilo) {
  constexpr float kLevels = 32512.f;
  const __m256i vmin = _mm256_set1_epi32(-32512), vmaxi = _mm256_set1_epi32(32512), k255 = _mm256_set1_epi32(255);
  const __m256 inv255 = _mm256_set1_ps(1.f / 255.f);
  for (int64_t g = 0; g < K / gs; ++g) {
    const float* xg = x + g * gs;
    const float amax = absmax_avx2(xg, gs);
    const float inv = amax > 0.f ? kLevels / amax : 0.f;
    dlo[g] = amax / kLevels;
    dhi[g] = dlo[g] * 255.f;
    const __m256 vinv = _mm256_set1_ps(inv);
    for (int i = 0; i < gs; i += 32) {
      __m256i h[4], l[4];
      for (int j = 0; j < 4; ++j) {
        __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xg + i + 8 * j), vinv));
        v = _mm256_min_epi32(_mm256_max_epi32(v, vmin), vmaxi);
        h[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_cvtepi32_ps(v), inv255));
        l[j] = _mm256_sub_epi32(v, _mm256_mullo_epi32(h[j], k255));
      }
      store_i8x32(hi + g * gs + i, h[0], h[1], h[2], h[3]);
      store_i8x32(lo + g * gs + i, l[0], l[1], l[2], l[3]);
    }
  }
  group_sums(hi, K, gs, dhi, shi, ihi);
  group_sums(lo, K, gs, dlo, slo, ilo);
}

namespace i8_avx2 {
#define LATHE_I8_FN __attribute__((target("avx2,fma,f16c")))
#define LATHE_I8_DOT 0
#include "tensor/cpu/quantized_int8_tile.inc"
#undef LATHE_I8_FN
#undef LATHE_I8_DOT
}  // namespace i8_avx2

namespace i8_avxvnni {
#define LATHE_I8_FN __attribute__((target("avx2,fma,f16c,avxvnni")))
#define LATHE_I8_DOT 1
#include "tensor/cpu/quantized_int8_tile.inc"
#undef LATHE_I8_FN
#undef LATHE_I8_DOT
}  // namespace i8_avxvnni

namespace i8_avx512vnni {
#define LATHE_I8_FN __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#define LATHE_I8_DOT 2
#include "tensor/cpu/quantized_int8_tile.inc"
#undef LATHE_I8_FN
#undef LATHE_I8_DOT
}  // namespace i8_avx512vnni

RowsFn pick_simd(Isa isa, const PackedQuant& p) {
  switch (isa) {
    case Isa::Avx2: return i8_avx2::pick(p);
    case Isa::AvxVnni: return i8_avxvnni::pick(p);
    case Isa::Avx512Vnni: return i8_avx512vnni::pick(p);
    case Isa::Scalar:
    case Isa::NeonDot: break;
  }
  return nullptr;
}
#endif

#if defined(__aarch64__)
// The packed layout serves sdot as it serves vpdpbusd: 16 bytes of a 64-byte chunk are 4 consecutive codes of 4
// rows, so one sdot against 4 activations repeated in every lane adds one step of 4 rows' dots. sdot multiplies
// signed bytes: 4-bit codes (0..15) are already non-negative int8; 8-bit codes go in as code − 128 and the
// group's 128 · Σ xq is added back, so every integer dot is exact and the float steps are the scalar kernel's.
LATHE_NEON_DOT_FN float32x4_t load4(const void* base, int i, bool sb16) {
  if (!sb16) return vld1q_f32(static_cast<const float*>(base) + i);
  return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(static_cast<const uint16_t*>(base) + i), 16));
}

// One 16-row block against one activation row: out[r] for the block's rows r.
LATHE_NEON_DOT_FN void block_row_neon_dot(const PackedQuant& p, int64_t b, const XRow& x, float* out) {
  const int gs = p.group_size;
  float32x4_t acc[4] = {vdupq_n_f32(0.f), vdupq_n_f32(0.f), vdupq_n_f32(0.f), vdupq_n_f32(0.f)};
  for (int64_t g = 0; g < p.groups; ++g) {
    const uint8_t* w = p.group(b, g);
    const int8_t* xq = x.q + g * gs;
    int32x4_t is[4] = {vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)};
    if (p.bits == 4) {
      const uint8x16_t lo_mask = vdupq_n_u8(0xF);
      for (int c = 0; c < gs / 8; ++c, w += 64) {  // elements 8c + j (low nibbles) and 8c + 4 + j (high)
        int32_t lo, hi;
        std::memcpy(&lo, xq + 8 * c, 4);
        std::memcpy(&hi, xq + 8 * c + 4, 4);
        const int8x16_t xl = vreinterpretq_s8_s32(vdupq_n_s32(lo)), xh = vreinterpretq_s8_s32(vdupq_n_s32(hi));
        for (int q = 0; q < 4; ++q) {
          const uint8x16_t v = vld1q_u8(w + 16 * q);
          is[q] = vdotq_s32(is[q], vreinterpretq_s8_u8(vandq_u8(v, lo_mask)), xl);
          is[q] = vdotq_s32(is[q], vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), xh);
        }
      }
    } else {
      const uint8x16_t flip = vdupq_n_u8(0x80);
      for (int c = 0; c < gs / 4; ++c, w += 64) {  // elements 4c + j
        int32_t x4;
        std::memcpy(&x4, xq + 4 * c, 4);
        const int8x16_t xv = vreinterpretq_s8_s32(vdupq_n_s32(x4));
        for (int q = 0; q < 4; ++q)
          is[q] = vdotq_s32(is[q], vreinterpretq_s8_u8(veorq_u8(vld1q_u8(w + 16 * q), flip)), xv);
      }
      const int32x4_t back = vdupq_n_s32(128 * x.qsum[g]);
      for (int q = 0; q < 4; ++q) is[q] = vaddq_s32(is[q], back);
    }
    const void* sc = p.scales(b, g);
    const void* bi = p.biases(b, g);
    const float32x4_t xsum = vdupq_n_f32(x.sum[g]);
    for (int q = 0; q < 4; ++q) {
      const float32x4_t sd = vmulq_n_f32(load4(sc, 4 * q, p.sb16), x.d[g]);
      acc[q] = vfmaq_f32(acc[q], vcvtq_f32_s32(is[q]), sd);        // fma(float(isum), scale · d, acc)
      acc[q] = vfmaq_f32(acc[q], load4(bi, 4 * q, p.sb16), xsum);  // fma(bias, xsum, acc)
    }
  }
  for (int q = 0; q < 4; ++q) vst1q_f32(out + 4 * q, acc[q]);
}

// Blocks [b0, b1) for M activation rows, writing y[M, N] for rows [row0, row0 + N).
void rows_neon_dot(const PackedQuant& p, int64_t b0, int64_t b1, const XRow* x, int64_t M, int64_t row0, int64_t N,
                   float* y) {
  constexpr int64_t R = PackedQuant::kBlockRows;
  float out[R];
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t n0 = std::max(b * R, row0), n1 = std::min((b + 1) * R, row0 + N);
    for (int64_t m = 0; m < M; ++m) {
      block_row_neon_dot(p, b, x[m], out);
      for (int64_t n = n0; n < n1; ++n) y[m * N + (n - row0)] = out[n - b * R];
    }
  }
}
#endif

// Per-thread activation buffers, reused across calls.
struct Scratch {
  std::vector<int8_t> q;
  std::vector<float> d, sum;
  std::vector<int32_t> qsum;
  std::vector<XRow> rows;
  std::vector<float> y2;  // 16-bit activations: the hi and lo rows' outputs before they are added
};

// One weight of a call: rows [row0, row0 + N) into y[XM, N]; with pair_sum (16-bit activations: rows 2m and
// 2m + 1 of y are one row's hi and lo) its tasks also write pair_sum[m, n] = y[2m, n] + y[2m + 1, n] for their
// own columns, while they are in cache.
struct Job {
  const PackedQuant* p;
  int64_t row0, N;
  float* y;
  float* pair_sum;
};

// The jobs' outputs from XM quantized activation rows, on the best kernel for isa: the blocks of all jobs in
// one parallel region (one barrier for q|k|v instead of three).
void run_jobs(const Job* jobs, int n, const XRow* xr, int64_t XM, Isa isa);

}  // namespace

void linear_packed(const float* x, int64_t M, const PackedQuant& p, int64_t row0, int64_t N, float* y) {
  const PackedLinear call{&p, row0, N, y};
  linear_packed_many(x, M, &call, 1);
}

void linear_packed_many(const float* x, int64_t M, const PackedLinear* calls, int n) {
  if (n <= 0) return;
  const PackedQuant& p = *calls[0].p;
  const int64_t K = p.cols, G = p.groups;
  [[maybe_unused]] const Isa isa = active_isa();  // the SIMD kernels' (x86, Arm); the scalar rows otherwise
  thread_local Scratch sc;
  const bool split = p.act_bits == 16;
  const int64_t XM = split ? 2 * M : M;  // int8 activation rows: hi and lo of each row when split
  sc.q.resize(static_cast<size_t>(XM * K));
  sc.d.resize(static_cast<size_t>(XM * G));
  sc.sum.resize(static_cast<size_t>(XM * G));
  sc.qsum.resize(static_cast<size_t>(XM * G));
  sc.rows.resize(static_cast<size_t>(XM));
  int8_t* qb = sc.q.data();
  float* db = sc.d.data();
  float* sb = sc.sum.data();
  int32_t* ib = sc.qsum.data();
  parallel_for(M, 4, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      if (split) {
        const int64_t h = 2 * m, l = 2 * m + 1;
#ifdef LATHE_X86
        if (isa != Isa::Scalar) {
          quantize_row_split_avx2(x + m * K, K, p.group_size, qb + h * K, db + h * G, sb + h * G, ib + h * G,
                                  qb + l * K, db + l * G, sb + l * G, ib + l * G);
          continue;
        }
#endif
        quantize_row_split(x + m * K, K, p.group_size, qb + h * K, db + h * G, sb + h * G, ib + h * G, qb + l * K,
                           db + l * G, sb + l * G, ib + l * G);
        continue;
      }
#ifdef LATHE_X86
      if (isa != Isa::Scalar) {
        quantize_row_avx2(x + m * K, K, p.group_size, qb + m * K, db + m * G, sb + m * G, ib + m * G);
        continue;
      }
#endif
      quantize_row_scalar(x + m * K, K, p.group_size, qb + m * K, db + m * G, sb + m * G, ib + m * G);
    }
  });
  for (int64_t m = 0; m < XM; ++m)
    sc.rows[static_cast<size_t>(m)] = XRow{qb + m * K, db + m * G, sb + m * G, ib + m * G};
  Job jobs[8];
  float* y2 = nullptr;
  if (split) {
    // The 2M int8 rows through the int8 kernels (one weight pass), each row's two halves added by the same tasks.
    int64_t cols = 0;
    for (int i = 0; i < n; ++i) cols += calls[i].N;
    sc.y2.resize(static_cast<size_t>(XM * cols));
    y2 = sc.y2.data();
  }
  for (int at = 0; at < n; at += 8) {  // 8 weights a region (callers pass at most 4)
    const int k = std::min(8, n - at);
    for (int i = 0; i < k; ++i) {
      const PackedLinear& c = calls[at + i];
      jobs[i] = split ? Job{c.p, c.row0, c.N, y2, c.y} : Job{c.p, c.row0, c.N, c.y, nullptr};
      if (split) y2 += XM * c.N;
    }
    run_jobs(jobs, k, sc.rows.data(), XM, isa);
  }
}

namespace {

void run_jobs(const Job* jobs, int n, const XRow* xr, int64_t M, [[maybe_unused]] Isa isa) {
  constexpr int64_t R = PackedQuant::kBlockRows;
  // Job j's blocks, from first[j] of its weight on, are [start[j], start[j + 1]) of the region's range.
  int64_t first[8], start[9];
  start[0] = 0;
  for (int j = 0; j < n; ++j) {
    first[j] = jobs[j].row0 / R;
    start[j + 1] = start[j] + (jobs[j].row0 + jobs[j].N + R - 1) / R - first[j];
  }
  [[maybe_unused]] RowsFn fns[8] = {};
  bool simd = false;
#ifdef LATHE_X86
  simd = true;
  for (int j = 0; j < n; ++j) simd = simd && (fns[j] = pick_simd(isa, *jobs[j].p)) != nullptr;
#endif
#if defined(__aarch64__)
  simd = isa == Isa::NeonDot;
#endif
  // Blocks [b0, b1) of job j, then their columns' pair sums.
  auto blocks = [&](const Job& jb, [[maybe_unused]] RowsFn fn, int64_t b0, int64_t b1) {
    const PackedQuant& p = *jb.p;
    const int64_t row0 = jb.row0, N = jb.N;
    float* y = jb.y;
    const int64_t c0 = std::max(row0, b0 * R) - row0, c1 = std::min(row0 + N, b1 * R) - row0;
    if (simd) {
#ifdef LATHE_X86
      fn(p, b0, b1, xr, M, row0, N, y);
#endif
#if defined(__aarch64__)
      rows_neon_dot(p, b0, b1, xr, M, row0, N, y);
#endif
    } else {
      for (int64_t c = c0; c < c1; ++c)
        for (int64_t m = 0; m < M; ++m) y[m * N + c] = dot_row_scalar(p, row0 + c, xr[m]);
    }
    if (!jb.pair_sum) return;
    for (int64_t m = 0; m < M / 2; ++m) {
      const float* __restrict a = y + 2 * m * N;
      const float* __restrict b = a + N;
      float* __restrict out = jb.pair_sum + m * N;
      for (int64_t c = c0; c < c1; ++c) out[c] = a[c] + b[c];
    }
  };
  // Prefill calls (more than 4 rows) take two ranges per thread: a thread that starts late then holds up
  // the other less (128-token prefill ~3% faster than one range per thread); decode rows take the default one.
  parallel_for(
      start[n], 1,
      [&](int64_t a, int64_t b) {
        for (int j = 0; j < n; ++j) {
          const int64_t lo = std::max(a, start[j]), hi = std::min(b, start[j + 1]);
          if (lo < hi) blocks(jobs[j], fns[j], first[j] + lo - start[j], first[j] + hi - start[j]);
        }
      },
      M <= 4 ? 1 : 2);
}

}  // namespace

}  // namespace lathe::cpu
