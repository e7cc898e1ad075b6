// MLX affine quantized matmul on the CPU.
// Decode (one row of x) is a fused dequant-GEMV that reads each packed weight byte once: x is permuted once
// per call so that the 8 lanes of a 256-bit load of 8 words line up with the j-th element of each word,
// then every element position j costs shift + mask + convert + FMA. Prefill dequantizes weight tiles to f32
// and reuses them across all rows of x.
#include <algorithm>
#include <cmath>
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

#ifdef LATHE_AVX2
// The AVX2 GEMV works in 16-bit integers: x is quantized per group to int16 (relative error ≤ 1.5e-5 of the
// group's largest |x|, far inside the parity bound), codes are unpacked into 16-bit lanes with one shift and
// one mask, and vpmaddwd multiplies and pairs them into int32 — about half the instructions of a
// convert-to-float path on a core whose vector ports are the limit. Lane m of a 256-bit block holds the
// 16/bits codes of elements m·(16/bits)…; x is permuted once per call to match.
struct XInt16 {
  std::vector<int16_t> perm;  // permuted, per 8-word block
  std::vector<float> scale;   // per group: x ≈ scale · x16
  std::vector<float> sum;     // per group: Σ scale · x16, for the bias term
};

XInt16 quantize_x(const Geometry& g, const float* x, int64_t nblocks) {
  XInt16 xq;
  const int cpl = 16 / g.bits;  // codes per 16-bit lane
  const int64_t EB = 8 * g.epw;
  xq.scale.resize(static_cast<size_t>(g.G));
  std::vector<int16_t> q16(static_cast<size_t>(g.K));
  for (int64_t grp = 0; grp < g.G; ++grp) {
    float amax = 0.f;
    for (int k = 0; k < g.gs; ++k) amax = std::max(amax, std::abs(x[grp * g.gs + k]));
    const float sc = amax > 0.f ? amax / 32767.f : 1.f;
    xq.scale[static_cast<size_t>(grp)] = sc;
    int64_t isum = 0;
    for (int k = 0; k < g.gs; ++k) {
      q16[static_cast<size_t>(grp * g.gs + k)] = static_cast<int16_t>(std::nearbyint(x[grp * g.gs + k] / sc));
      isum += q16[static_cast<size_t>(grp * g.gs + k)];
    }
    xq.sum.push_back(sc * static_cast<float>(isum));
  }
  xq.perm.resize(static_cast<size_t>(nblocks * EB));
  for (int64_t b = 0; b < nblocks; ++b)
    for (int m = 0; m < 16; ++m)
      for (int j = 0; j < cpl; ++j)
        xq.perm[static_cast<size_t>(b * EB + j * 16 + m)] = q16[static_cast<size_t>(b * EB + m * cpl + j)];
  return xq;
}

// Σ over one block of codes·x16 into int32 lanes; lane i covers word i of the block.
template <int BITS, int J>
inline __m256i block_dot(__m256i v, const int16_t* xp, __m256i acc) {
  constexpr int CPL = 16 / BITS;
  if constexpr (J < CPL) {
    __m256i c = J == 0 ? v : _mm256_srli_epi16(v, BITS * J);
    if constexpr (J != CPL - 1) c = _mm256_and_si256(c, _mm256_set1_epi16((1 << BITS) - 1));
    acc =
        _mm256_add_epi32(acc, _mm256_madd_epi16(c, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xp + J * 16))));
    return block_dot<BITS, J + 1>(v, xp, acc);
  }
  return acc;
}

// Whole-block part of R rows (R ≤ 4): out[r] = Σ_groups (scale·x_scale) · Σ codes·x16. Rows share the x loads.
// ws[r] holds row r's per-group scale·x_scale.
template <int BITS, int R>
void gemv_rows_blocks(const Geometry& g, const uint32_t* const* w, const float* const* ws, const int16_t* xperm,
                      int64_t nblocks, float* out) {
  constexpr int EB = 8 * (32 / BITS);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  if (g.wpg >= 8) {  // a group is one or more whole blocks: integer sums run across the group
    const int64_t bpg = g.wpg / 8;
    for (int64_t b0 = 0; b0 < nblocks; b0 += bpg) {
      __m256i isum[R];
      for (int r = 0; r < R; ++r) isum[r] = _mm256_setzero_si256();
      for (int64_t b = b0; b < b0 + bpg; ++b) {
        const int16_t* xp = xperm + b * EB;
        for (int r = 0; r < R; ++r)
          isum[r] = block_dot<BITS, 0>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + b * 8)), xp, isum[r]);
      }
      for (int r = 0; r < R; ++r)
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_set1_ps(ws[r][b0 / bpg]), acc[r]);
    }
  } else {  // groups smaller than a block: lane i (word i) takes its own group's scale
    for (int64_t b = 0; b < nblocks; ++b) {
      const int16_t* xp = xperm + b * EB;
      for (int r = 0; r < R; ++r) {
        const __m256i isum = block_dot<BITS, 0>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + b * 8)), xp,
                                                _mm256_setzero_si256());
        alignas(32) float l[8];
        for (int i = 0; i < 8; ++i) l[i] = ws[r][(b * 8 + i) / g.wpg];
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_load_ps(l), acc[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(acc[r]);
}

template <int BITS>
void gemv_rows_dispatch(int rows, const Geometry& g, const uint32_t* const* w, const float* const* ws,
                        const int16_t* xperm, int64_t nblocks, float* out) {
  switch (rows) {
    case 4: gemv_rows_blocks<BITS, 4>(g, w, ws, xperm, nblocks, out); break;
    case 3: gemv_rows_blocks<BITS, 3>(g, w, ws, xperm, nblocks, out); break;
    case 2: gemv_rows_blocks<BITS, 2>(g, w, ws, xperm, nblocks, out); break;
    default: gemv_rows_blocks<BITS, 1>(g, w, ws, xperm, nblocks, out); break;
  }
}
#endif

// Fused GEMV for one row of x: y[n] = Σ_k x[k] · (s·q + b) = Σ_g s_g Σ_{k∈g} q_k x_k + Σ_g b_g xsum_g.
void gemv(const Geometry& g, const QuantizedMatrix& q, const float* x, float* y, int64_t N) {
  std::vector<float> xsum(static_cast<size_t>(g.G));
  for (int64_t grp = 0; grp < g.G; ++grp) {
    float s = 0;
    for (int k = 0; k < g.gs; ++k) s += x[grp * g.gs + k];
    xsum[static_cast<size_t>(grp)] = s;
  }
  int64_t nblocks = 0;
#ifdef LATHE_AVX2
  // Whole blocks must not split a group's integer sum: when groups span several blocks, use whole groups.
  nblocks = g.wpg >= 8 ? (g.W / g.wpg) * (g.wpg / 8) : g.W / 8;
  const XInt16 xq = quantize_x(g, x, nblocks);
  // The bias term must see the same (int16) x as the codes of its group: with the exact x, the code and bias
  // terms (which largely cancel for zero-centred weights) would each carry the rounding separately.
  for (int64_t grp = 0; grp < g.G && (grp + 1) * g.wpg <= nblocks * 8; ++grp)
    xsum[static_cast<size_t>(grp)] = xq.sum[static_cast<size_t>(grp)];
#endif
  constexpr int kRows = 4;
  parallel_for(N, 16, [&](int64_t n0, int64_t n1) {
    std::vector<float> sc(static_cast<size_t>(kRows * g.G)), bi(static_cast<size_t>(kRows * g.G)),
        ws(static_cast<size_t>(kRows * g.G));
    for (int64_t n = n0; n < n1; n += kRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kRows, n1 - n));
      const uint32_t* w[kRows];
      const float* wsp[kRows];
      for (int r = 0; r < rows; ++r) {
        row_to_f32(q.scales, n + r, g.G, sc.data() + r * g.G);
        row_to_f32(q.biases, n + r, g.G, bi.data() + r * g.G);
        w[r] = row_words(q, n + r);
        wsp[r] = ws.data() + r * g.G;
      }
      float total[kRows] = {0.f, 0.f, 0.f, 0.f};
#ifdef LATHE_AVX2
      for (int r = 0; r < rows; ++r)
        for (int64_t grp = 0; grp < g.G; ++grp)
          ws[static_cast<size_t>(r * g.G + grp)] =
              sc[static_cast<size_t>(r * g.G + grp)] * xq.scale[static_cast<size_t>(grp)];
      switch (g.bits) {
        case 2: gemv_rows_dispatch<2>(rows, g, w, wsp, xq.perm.data(), nblocks, total); break;
        case 4: gemv_rows_dispatch<4>(rows, g, w, wsp, xq.perm.data(), nblocks, total); break;
        default: gemv_rows_dispatch<8>(rows, g, w, wsp, xq.perm.data(), nblocks, total); break;
      }
#endif
      const int64_t covered = nblocks * 8;  // words handled by whole blocks
      for (int r = 0; r < rows; ++r) {
        const float* rs = sc.data() + r * g.G;
        const float* rb = bi.data() + r * g.G;
        // Words not covered by whole blocks (and the whole row without AVX2), exact f32 in natural order.
        for (int64_t wi = covered; wi < g.W; ++wi) {
          const uint32_t word = w[r][wi];
          float part = 0.f;
          for (int j = 0; j < g.epw; ++j)
            part += static_cast<float>((word >> (g.bits * j)) & g.mask) * x[wi * g.epw + j];
          total[r] += rs[wi / g.wpg] * part;
        }
        float bias_term = 0.f;
        for (int64_t grp = 0; grp < g.G; ++grp) bias_term += rb[grp] * xsum[static_cast<size_t>(grp)];
        y[n + r] = total[r] + bias_term;
      }
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
