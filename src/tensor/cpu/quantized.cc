// MLX affine quantized matmul on the CPU.
// Decode (one row of x) is a fused dequant-GEMV that reads each packed weight byte once: x is permuted once
// per call so that the 8 lanes of a 256-bit load of 8 words line up with the j-th element of each word,
// then every element position j costs shift + mask + convert + FMA. Prefill dequantizes weight tiles to f32
// and reuses them across all rows of x.
#include <algorithm>
#include <cmath>
#include <vector>

#include "common/error.h"
#include "quant/affine.h"
#include "tensor/cpu/kernels.h"
#include "tensor/cpu/packed_quant.h"
#include "tensor/cpu/simd.h"
#include "tensor/thread_pool.h"

namespace lathe::cpu {
namespace {

struct Geometry {
  int bits, gs, epw, wpg;  // bits, group size, elements per word, words per group
  int64_t K, W, G;         // columns, words per row, groups per row
  uint32_t mask;
};

Geometry geometry(const QuantizedMatrix& q) {
  Geometry g{};
  g.bits = q.bits;
  g.gs = q.group_size;
  g.epw = 32 / q.bits;
  g.wpg = q.group_size / g.epw;
  g.W = q.w.dim(1);
  g.K = g.W * g.epw;
  g.G = g.K / g.gs;
  g.mask = (1u << q.bits) - 1u;
  return g;
}

const uint32_t* row_words(const QuantizedMatrix& q, int64_t row) { return q.w.data<uint32_t>() + row * q.w.stride(0); }

// Dequantizes one row (natural order) given its scales/biases in f32.
void dequant_row(const Geometry& g, const uint32_t* w, const float* sc, const float* bi, float* out) {
  for (int64_t grp = 0; grp < g.G; ++grp) {
    const float s = sc[grp], b = bi[grp];
    const uint32_t* wg = w + grp * g.wpg;
    float* og = out + grp * g.gs;
#ifdef LATHE_AVX2
    if (g.bits == 4) {
      const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
      const __m256i m = _mm256_set1_epi32(0xF);
      const __m256 vs = _mm256_set1_ps(s), vb = _mm256_set1_ps(b);
      for (int i = 0; i < g.wpg; ++i) {
        __m256i v = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(wg[i])), shifts), m);
        _mm256_storeu_ps(og + i * 8, _mm256_fmadd_ps(vs, _mm256_cvtepi32_ps(v), vb));
      }
      continue;
    }
    if (g.bits == 8 && g.wpg % 2 == 0) {
      const __m256 vs = _mm256_set1_ps(s), vb = _mm256_set1_ps(b);
      for (int i = 0; i < g.wpg; i += 2) {
        __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(wg + i));
        _mm256_storeu_ps(og + i * 4, _mm256_fmadd_ps(vs, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)), vb));
      }
      continue;
    }
#endif
    for (int i = 0; i < g.wpg; ++i) {
      uint32_t word = wg[i];
      for (int j = 0; j < g.epw; ++j) og[i * g.epw + j] = s * static_cast<float>((word >> (g.bits * j)) & g.mask) + b;
    }
  }
}

#ifdef LATHE_AVX2
// Σ over one 8-word block of codes · permuted x, for element position J of every word (lane i = word i).
// Shifts are compile-time constants, so a position costs shift + mask + convert + FMA. Exact f32: the decode
// path must match the reference as tightly as prefill does (recurrent layers amplify activation rounding).
template <int BITS, int J>
inline void block_positions(__m256i v, const float* xp, __m256& p0, __m256& p1) {
  constexpr int EPW = 32 / BITS;
  if constexpr (J < EPW) {
    __m256i c = J == 0 ? v : _mm256_srli_epi32(v, BITS * J);
    if constexpr (J != EPW - 1) c = _mm256_and_si256(c, _mm256_set1_epi32((1 << BITS) - 1));
    if constexpr (J % 2 == 0)
      p0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(c), _mm256_loadu_ps(xp + J * 8), p0);
    else
      p1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(c), _mm256_loadu_ps(xp + J * 8), p1);
    block_positions<BITS, J + 1>(v, xp, p0, p1);
  }
}

// Whole-block part of R rows (R ≤ 4): out[r] = Σ_blocks scale · Σ codes·x. The rows share the x loads and give
// the core independent FMA chains to overlap.
template <int BITS, int R>
void gemv_rows_blocks(const Geometry& g, const uint32_t* const* w, const float* const* sc, const float* xperm,
                      int64_t nblocks, float* out) {
  constexpr int EB = 8 * (32 / BITS);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const bool broadcast = g.wpg >= 8;
  const int bpg_shift = broadcast ? __builtin_ctz(static_cast<unsigned>(g.wpg / 8)) : 0;
  for (int64_t b = 0; b < nblocks; ++b) {
    const float* xp = xperm + b * EB;
    for (int r = 0; r < R; ++r) {
      __m256 p0 = _mm256_setzero_ps(), p1 = _mm256_setzero_ps();
      block_positions<BITS, 0>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + b * 8)), xp, p0, p1);
      __m256 s;
      if (broadcast) {
        s = _mm256_set1_ps(sc[r][b >> bpg_shift]);
      } else {  // groups smaller than a block: each lane (word) takes its own group's scale
        alignas(32) float l[8];
        for (int i = 0; i < 8; ++i) l[i] = sc[r][(b * 8 + i) / g.wpg];
        s = _mm256_load_ps(l);
      }
      acc[r] = _mm256_fmadd_ps(s, _mm256_add_ps(p0, p1), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(acc[r]);
}

template <int BITS>
void gemv_rows_dispatch(int rows, const Geometry& g, const uint32_t* const* w, const float* const* sc,
                        const float* xperm, int64_t nblocks, float* out) {
  switch (rows) {
    case 4: gemv_rows_blocks<BITS, 4>(g, w, sc, xperm, nblocks, out); break;
    case 3: gemv_rows_blocks<BITS, 3>(g, w, sc, xperm, nblocks, out); break;
    case 2: gemv_rows_blocks<BITS, 2>(g, w, sc, xperm, nblocks, out); break;
    default: gemv_rows_blocks<BITS, 1>(g, w, sc, xperm, nblocks, out); break;
  }
}
#endif

// Fused GEMV for one row of x: y[n] = Σ_k x[k] · (s·q + b) = Σ_g s_g Σ_{k∈g} q_k x_k + Σ_g b_g xsum_g.
// x is permuted once per call so the 8 lanes of a 256-bit load of 8 words line up with position j of each word.
void gemv(const Geometry& g, const QuantizedMatrix& q, const float* x, float* y, int64_t N) {
  std::vector<float> xsum(static_cast<size_t>(g.G));
  for (int64_t grp = 0; grp < g.G; ++grp) {
    float s = 0;
    for (int k = 0; k < g.gs; ++k) s += x[grp * g.gs + k];
    xsum[static_cast<size_t>(grp)] = s;
  }
  int64_t nblocks = 0;
  std::vector<float> xperm;
#ifdef LATHE_AVX2
  nblocks = g.W / 8;
  const int64_t EB = 8 * g.epw;
  xperm.resize(static_cast<size_t>(nblocks * EB));
  for (int64_t b = 0; b < nblocks; ++b)
    for (int i = 0; i < 8; ++i)
      for (int j = 0; j < g.epw; ++j) xperm[static_cast<size_t>(b * EB + j * 8 + i)] = x[b * EB + i * g.epw + j];
#endif
  constexpr int kRows = 4;
  parallel_for(N, 16, [&](int64_t n0, int64_t n1) {
    std::vector<float> sc(static_cast<size_t>(kRows * g.G)), bi(static_cast<size_t>(kRows * g.G));
    for (int64_t n = n0; n < n1; n += kRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kRows, n1 - n));
      const uint32_t* w[kRows];
      const float* s[kRows];
      for (int r = 0; r < rows; ++r) {
        scale_row_to_f32(q.scales, n + r, g.G, sc.data() + r * g.G);
        scale_row_to_f32(q.biases, n + r, g.G, bi.data() + r * g.G);
        w[r] = row_words(q, n + r);
        s[r] = sc.data() + r * g.G;
      }
      float total[kRows] = {0.f, 0.f, 0.f, 0.f};
#ifdef LATHE_AVX2
      switch (g.bits) {
        case 2: gemv_rows_dispatch<2>(rows, g, w, s, xperm.data(), nblocks, total); break;
        case 4: gemv_rows_dispatch<4>(rows, g, w, s, xperm.data(), nblocks, total); break;
        default: gemv_rows_dispatch<8>(rows, g, w, s, xperm.data(), nblocks, total); break;
      }
#endif
      const int64_t covered = nblocks * 8;  // words handled by whole blocks
      for (int r = 0; r < rows; ++r) {
        const float* rb = bi.data() + r * g.G;
        // Words not covered by whole blocks (and the whole row without AVX2), natural order.
        for (int64_t wi = covered; wi < g.W; ++wi) {
          const uint32_t word = w[r][wi];
          float part = 0.f;
          for (int j = 0; j < g.epw; ++j)
            part += static_cast<float>((word >> (g.bits * j)) & g.mask) * x[wi * g.epw + j];
          total[r] += s[r][wi / g.wpg] * part;
        }
        float bias_term = 0.f;
        for (int64_t grp = 0; grp < g.G; ++grp) bias_term += rb[grp] * xsum[static_cast<size_t>(grp)];
        y[n + r] = total[r] + bias_term;
      }
    }
  });
}

}  // namespace

// Declared in kernels.h: the scales and biases of quantized weights come as bf16, f16 or f32.
void scale_row_to_f32(const Tensor& t, int64_t row, int64_t n, float* out) {
  const char* base =
      static_cast<const char*>(t.raw()) + row * t.stride(0) * static_cast<int64_t>(dtype_size(t.dtype()));
  if (!floats_to_f32(base, t.dtype(), n, out))
    throw Error(ErrorKind::Unsupported, std::string("quantization scales of dtype ") + dtype_name(t.dtype()));
}

void dequantize_rows(const QuantizedMatrix& q, int64_t row0, int64_t n, float* out) {
  if (32 % q.bits != 0) {  // 3, 5, 6-bit codes straddle words (kept quantized only for the packed kernels)
    const int64_t K = q.cols(), G = K / q.group_size;
    std::vector<float> sc(static_cast<size_t>(G)), bi(static_cast<size_t>(G));
    for (int64_t r = 0; r < n; ++r) {
      scale_row_to_f32(q.scales, row0 + r, G, sc.data());
      scale_row_to_f32(q.biases, row0 + r, G, bi.data());
      quant::dequantize_row(row_words(q, row0 + r), K, q.bits, q.group_size, sc.data(), bi.data(), out + r * K);
    }
    return;
  }
  const Geometry g = geometry(q);
  std::vector<float> sc(static_cast<size_t>(g.G)), bi(static_cast<size_t>(g.G));
  for (int64_t r = 0; r < n; ++r) {
    scale_row_to_f32(q.scales, row0 + r, g.G, sc.data());
    scale_row_to_f32(q.biases, row0 + r, g.G, bi.data());
    dequant_row(g, row_words(q, row0 + r), sc.data(), bi.data(), out + r * g.K);
  }
}

void linear_quantized(const Tensor& x, const QuantizedMatrix& q, Tensor& y) {
  const Geometry g = geometry(q);
  const int64_t M = x.dim(0), N = q.rows();
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  if (q.cpu_packed) {  // the default: integer dots over the load-time packing (packed_quant.h)
    linear_packed(xp, M, *q.cpu_packed, q.cpu_packed_row0, N, yp);
    return;
  }
  if (M == 1) {
    gemv(g, q, xp, yp, N);
    return;
  }
  constexpr int64_t kTile = 16;
  parallel_for(N, kTile, [&](int64_t n0, int64_t n1) {
    std::vector<float> buf(static_cast<size_t>(kTile * g.K));
    for (int64_t n = n0; n < n1; n += kTile) {
      const int64_t R = std::min(kTile, n1 - n);
      dequantize_rows(q, n, R, buf.data());
      constexpr int64_t kMTile = 64;
      for (int64_t m = 0; m < M; m += kMTile)
        gemm_block_f32(xp + m * g.K, std::min(kMTile, M - m), g.K, buf.data(), R, yp + m * N + n, N);
    }
  });
}

}  // namespace lathe::cpu
