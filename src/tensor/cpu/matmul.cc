// Dense matmul y = x · Wᵀ with f32 accumulation. Weight rows are converted to f32 in small tiles that stay in
// cache and are reused across all rows of x (prefill); for one row of x this is a streaming GEMV.
#include <algorithm>
#include <vector>

#include "common/error.h"
#include "tensor/cpu/kernels.h"
#include "tensor/cpu/simd.h"
#include "tensor/thread_pool.h"

namespace lathe::cpu {

#ifdef LATHE_AVX2
namespace {
inline __m256 load_w8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load_w8(const uint16_t* p) { return load_bf16x8(p); }

// Row xm against weight rows w0 and w1 (f32, or bf16 widened as read): one 8-lane accumulator per output, summed
// once. Every path that is meant to give a row the same result whatever the batch runs exactly this.
template <class WT>
inline void dot_row_pair(const float* xm, const WT* w0, const WT* w1, int64_t K, float& y0, float& y1) {
  __m256 c0 = _mm256_setzero_ps(), c1 = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 8) {
    const __m256 v = _mm256_loadu_ps(xm + k);
    c0 = _mm256_fmadd_ps(v, load_w8(w0 + k), c0);
    c1 = _mm256_fmadd_ps(v, load_w8(w1 + k), c1);
  }
  y0 = hsum(c0);
  y1 = hsum(c1);
}
}  // namespace
#endif

void gemm_block_f32(const float* x, int64_t M, int64_t K, const float* w, int64_t R, float* y, int64_t ldy) {
  int64_t r = 0;
#ifdef LATHE_AVX2
  const bool vec_ok = (K % 8) == 0;
  if (vec_ok) {
    for (; r + 2 <= R; r += 2) {
      const float* w0 = w + r * K;
      const float* w1 = w0 + K;
      int64_t m = 0;
      for (; m + 4 <= M; m += 4) {
        const float* x0 = x + m * K;
        __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps(), c10 = _mm256_setzero_ps(),
               c11 = _mm256_setzero_ps(), c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps(),
               c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
        for (int64_t k = 0; k < K; k += 8) {
          __m256 a = _mm256_loadu_ps(w0 + k), b = _mm256_loadu_ps(w1 + k);
          __m256 v0 = _mm256_loadu_ps(x0 + k);
          c00 = _mm256_fmadd_ps(v0, a, c00);
          c01 = _mm256_fmadd_ps(v0, b, c01);
          __m256 v1 = _mm256_loadu_ps(x0 + K + k);
          c10 = _mm256_fmadd_ps(v1, a, c10);
          c11 = _mm256_fmadd_ps(v1, b, c11);
          __m256 v2 = _mm256_loadu_ps(x0 + 2 * K + k);
          c20 = _mm256_fmadd_ps(v2, a, c20);
          c21 = _mm256_fmadd_ps(v2, b, c21);
          __m256 v3 = _mm256_loadu_ps(x0 + 3 * K + k);
          c30 = _mm256_fmadd_ps(v3, a, c30);
          c31 = _mm256_fmadd_ps(v3, b, c31);
        }
        float* yr = y + m * ldy + r;
        yr[0] = hsum(c00);
        yr[1] = hsum(c01);
        yr[ldy] = hsum(c10);
        yr[ldy + 1] = hsum(c11);
        yr[2 * ldy] = hsum(c20);
        yr[2 * ldy + 1] = hsum(c21);
        yr[3 * ldy] = hsum(c30);
        yr[3 * ldy + 1] = hsum(c31);
      }
      // The rows past the last block of 4 run the same arithmetic (one 8-lane accumulator per output, summed
      // once): a row's result never depends on how many rows share the call (batched = solo, bit for bit).
      for (; m < M; ++m) dot_row_pair(x + m * K, w0, w1, K, y[m * ldy + r], y[m * ldy + r + 1]);
    }
  }
#endif
  for (; r < R; ++r)
    for (int64_t m = 0; m < M; ++m) y[m * ldy + r] = dot_f32(x + m * K, w + r * K, K);
}

void dense_row_to_f32(const Tensor& w, int64_t row, float* out) {
  const int64_t K = w.dim(1);
  const char* base =
      static_cast<const char*>(w.raw()) + row * w.stride(0) * static_cast<int64_t>(dtype_size(w.dtype()));
  switch (w.dtype()) {
    case DType::F32: std::memcpy(out, base, static_cast<size_t>(K) * 4); break;
    case DType::BF16: {
      const auto* p = reinterpret_cast<const uint16_t*>(base);
      int64_t k = 0;
#ifdef LATHE_AVX2
      for (; k + 8 <= K; k += 8) _mm256_storeu_ps(out + k, load_bf16x8(p + k));
#endif
      for (; k < K; ++k) out[k] = bf16_to_f32(p[k]);
      break;
    }
    case DType::F16: {
      const auto* p = reinterpret_cast<const uint16_t*>(base);
      int64_t k = 0;
#ifdef LATHE_AVX2
      for (; k + 8 <= K; k += 8)
        _mm256_storeu_ps(out + k, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + k))));
#endif
      for (; k < K; ++k) out[k] = f16_to_f32(p[k]);
      break;
    }
    default: throw Error(ErrorKind::Unsupported, std::string("dense weight dtype ") + dtype_name(w.dtype()));
  }
}

#ifdef LATHE_AVX2
namespace {
// Decode rows (M ≤ 2) against bf16 weights, widened in registers instead of through an f32 tile: converting
// every weight to memory and reading it back cost more than the multiply (a bf16 checkpoint's decode). Per
// output the same FMAs in the same order as gemm_block_f32 (one 8-lane accumulator, summed once), and an odd
// last row goes through the same dot_f32, so the outputs are bitwise the tile path's.
void gemv_bf16_rows(const float* x, int64_t M, int64_t K, const Tensor& w, int64_t n0, int64_t n1, float* y,
                    int64_t ldy) {
  const auto* wp = static_cast<const uint16_t*>(w.raw());
  int64_t n = n0;
  for (; n + 2 <= n1; n += 2) {
    const uint16_t* w0 = wp + n * w.stride(0);
    const uint16_t* w1 = w0 + w.stride(0);
    for (int64_t m = 0; m < M; ++m) dot_row_pair(x + m * K, w0, w1, K, y[m * ldy + n], y[m * ldy + n + 1]);
  }
  if (n < n1) {
    std::vector<float> row(static_cast<size_t>(K));
    dense_row_to_f32(w, n, row.data());
    for (int64_t m = 0; m < M; ++m) y[m * ldy + n] = dot_f32(x + m * K, row.data(), K);
  }
}
}  // namespace
#endif

void linear_dense(const Tensor& x, const Tensor& w, Tensor& y) {
  const int64_t M = x.dim(0), K = x.dim(1), N = w.dim(0);
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
#ifdef LATHE_AVX2
  if (M <= 2 && w.dtype() == DType::BF16 && w.stride(1) == 1 && K % 8 == 0) {
    // Tiles of 16 rows, as below, so the odd row (if any) is the same one.
    parallel_for(N, 16, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; n += 16) gemv_bf16_rows(xp, M, K, w, n, std::min(n + 16, n1), yp, N);
    });
    return;
  }
#endif
  constexpr int64_t kTile = 16;  // weight rows converted per step: 16 x K floats stays in L2
  const bool direct = w.dtype() == DType::F32 && w.stride(1) == 1;
  parallel_for(N, kTile, [&](int64_t n0, int64_t n1) {
    std::vector<float> buf(direct ? 0 : static_cast<size_t>(kTile * K));
    for (int64_t n = n0; n < n1; n += kTile) {
      const int64_t R = std::min(kTile, n1 - n);
      const float* rows;
      if (direct && w.stride(0) == K) {
        rows = w.data<float>() + n * K;
      } else {
        if (buf.empty()) buf.resize(static_cast<size_t>(kTile * K));
        for (int64_t r = 0; r < R; ++r) dense_row_to_f32(w, n + r, buf.data() + r * K);
        rows = buf.data();
      }
      // Tile x rows so a block of x stays in cache while it meets the weight tile.
      constexpr int64_t kMTile = 64;
      for (int64_t m = 0; m < M; m += kMTile)
        gemm_block_f32(xp + m * K, std::min(kMTile, M - m), K, rows, R, yp + m * N + n, N);
    }
  });
}

}  // namespace lathe::cpu
