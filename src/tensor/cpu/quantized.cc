// MLX affine quantized matmul on the CPU.
// Decode (one row of x) is a fused dequant-GEMV that reads each packed weight byte once: x is permuted once
// per call so that the 8 lanes of a 256-bit load of 8 words line up with the j-th element of each word,
// then every element position j costs shift + mask + convert + FMA. Prefill dequantizes weight tiles to f32
// and reuses them across all rows of x.
#include <algorithm>
#include <vector>

#include "common/error.h"
#include "tensor/cpu/kernels.h"
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

void row_to_f32(const Tensor& t, int64_t row, int64_t n, float* out) {
  const int64_t es = static_cast<int64_t>(dtype_size(t.dtype()));
  const char* base = static_cast<const char*>(t.raw()) + row * t.stride(0) * es;
  switch (t.dtype()) {
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(reinterpret_cast<const uint16_t*>(base)[i]);
      break;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(reinterpret_cast<const uint16_t*>(base)[i]);
      break;
    case DType::F32: std::memcpy(out, base, static_cast<size_t>(n) * 4); break;
    default: throw Error(ErrorKind::Unsupported, std::string("quantization scales of dtype ") + dtype_name(t.dtype()));
  }
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

// Fused GEMV for one row of x: y[n] = Σ_k x[k] · (s·q + b) = Σ_g s_g Σ_{k∈g} q_k x_k + Σ_g b_g xsum_g.
void gemv(const Geometry& g, const QuantizedMatrix& q, const float* x, float* y, int64_t N) {
  const int64_t nblocks = g.W / 8;  // 8 words per 256-bit load
  const int64_t EB = 8 * g.epw;     // elements per block
  std::vector<float> xperm(static_cast<size_t>(nblocks * EB));
  for (int64_t b = 0; b < nblocks; ++b)
    for (int i = 0; i < 8; ++i)
      for (int j = 0; j < g.epw; ++j) xperm[static_cast<size_t>(b * EB + j * 8 + i)] = x[b * EB + i * g.epw + j];
  std::vector<float> xsum(static_cast<size_t>(g.G));
  for (int64_t grp = 0; grp < g.G; ++grp) {
    float s = 0;
    for (int k = 0; k < g.gs; ++k) s += x[grp * g.gs + k];
    xsum[static_cast<size_t>(grp)] = s;
  }
  parallel_for(N, 8, [&](int64_t n0, int64_t n1) {
    std::vector<float> sc(static_cast<size_t>(g.G)), bi(static_cast<size_t>(g.G));
    for (int64_t n = n0; n < n1; ++n) {
      row_to_f32(q.scales, n, g.G, sc.data());
      row_to_f32(q.biases, n, g.G, bi.data());
      const uint32_t* w = row_words(q, n);
      float total = 0.f;
      int64_t b = 0;
#ifdef LATHE_AVX2
      const __m256i m = _mm256_set1_epi32(static_cast<int>(g.mask));
      __m256 acc = _mm256_setzero_ps();
      for (; b < nblocks; ++b) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + b * 8));
        const float* xp = xperm.data() + b * EB;
        __m256 part0 = _mm256_setzero_ps(), part1 = _mm256_setzero_ps();
        int j = 0;
        for (; j + 2 <= g.epw; j += 2) {
          __m256 q0 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v, g.bits * j), m));
          __m256 q1 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v, g.bits * (j + 1)), m));
          part0 = _mm256_fmadd_ps(q0, _mm256_loadu_ps(xp + j * 8), part0);
          part1 = _mm256_fmadd_ps(q1, _mm256_loadu_ps(xp + (j + 1) * 8), part1);
        }
        const __m256 part = _mm256_add_ps(part0, part1);
        __m256 svec;
        if (g.wpg >= 8) {
          svec = _mm256_set1_ps(sc[static_cast<size_t>(b * 8 / g.wpg)]);
        } else {
          alignas(32) float lanes[8];
          for (int i = 0; i < 8; ++i) lanes[i] = sc[static_cast<size_t>((b * 8 + i) / g.wpg)];
          svec = _mm256_load_ps(lanes);
        }
        acc = _mm256_fmadd_ps(svec, part, acc);
      }
      total = hsum(acc);
#else
      b = 0;
#endif
      // Words not covered by whole blocks (and the whole row without AVX2), natural order.
      for (int64_t wi = b * 8; wi < g.W; ++wi) {
        const uint32_t word = w[wi];
        const float s = sc[static_cast<size_t>(wi / g.wpg)];
        float part = 0.f;
        for (int j = 0; j < g.epw; ++j) part += static_cast<float>((word >> (g.bits * j)) & g.mask) * x[wi * g.epw + j];
        total += s * part;
      }
      float bias_term = 0.f;
      for (int64_t grp = 0; grp < g.G; ++grp)
        bias_term += bi[static_cast<size_t>(grp)] * xsum[static_cast<size_t>(grp)];
      y[n] = total + bias_term;
    }
  });
}

}  // namespace

void dequantize_rows(const QuantizedMatrix& q, int64_t row0, int64_t n, float* out) {
  const Geometry g = geometry(q);
  std::vector<float> sc(static_cast<size_t>(g.G)), bi(static_cast<size_t>(g.G));
  for (int64_t r = 0; r < n; ++r) {
    row_to_f32(q.scales, row0 + r, g.G, sc.data());
    row_to_f32(q.biases, row0 + r, g.G, bi.data());
    dequant_row(g, row_words(q, row0 + r), sc.data(), bi.data(), out + r * g.K);
  }
}

void linear_quantized(const Tensor& x, const QuantizedMatrix& q, Tensor& y) {
  const Geometry g = geometry(q);
  const int64_t M = x.dim(0), N = q.rows();
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
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
