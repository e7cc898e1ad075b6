// CPU kernels behind ops.h. Inputs are validated by ops.cc; kernels assume CPU, f32 activations.
#pragma once
#include <algorithm>
#include <cstdint>

#include "tensor/ops.h"

namespace lathe::cpu {

// y[M, N] = x[M, K] · w[N, K]ᵀ for dense f32/bf16/f16 weights.
void linear_dense(const Tensor& x, const Tensor& w, Tensor& y);
// The same over an MLX affine-quantized weight.
void linear_quantized(const Tensor& x, const QuantizedMatrix& w, Tensor& y);
// Rows [row0, row0 + n) of a quantized matrix as f32, row-major into out[n * cols].
void dequantize_rows(const QuantizedMatrix& w, int64_t row0, int64_t n, float* out);
// The first n values of row `row` of a bf16/f16/f32 tensor (quantization scales or biases) as f32.
void scale_row_to_f32(const Tensor& t, int64_t row, int64_t n, float* out);
// One dense row (any float dtype) as f32.
void dense_row_to_f32(const Tensor& w, int64_t row, float* out);

// Dot-product block: y[m * ldy + r] = Σ_k x[m*K + k] · wrows[r*K + k] for m < M, r < R.
void gemm_block_f32(const float* x, int64_t M, int64_t K, const float* wrows, int64_t R, float* y, int64_t ldy);

void rms_norm(const Tensor& x, const Tensor& w, float eps, bool plus_one, Tensor& out);
void rope_inplace(Tensor& x, const RopeTable& rope, int64_t pos0);
void attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, Tensor& out);
// The attention kernels' shared masking: whether a query at qpos sees a key at kpos (causal, window), and for
// keys at linear positions (k_pos0 + j, no explicit k_pos) the range [j0, j1) of the S keys it can see;
// with explicit positions the range is all S keys and each is checked with key_visible.
inline bool key_visible(const AttentionParams& p, int64_t qpos, int64_t kpos) {
  return !(p.causal && kpos > qpos) && !(p.window > 0 && qpos - kpos >= p.window);
}
// An attention call over at most this many query rows is a decode step (one row per sequence).
constexpr int64_t kAttentionDecodeRows = 4;
// Ranges per thread of an attention region: decode takes one; a causal prefill's tasks grow with the query row,
// so one contiguous range per thread would leave the first thread idle for most of the region (512-token
// prefill 9% slower): eight keep the claims balanced.
inline int attention_chunks_per_thread(int64_t query_rows) { return query_rows <= kAttentionDecodeRows ? 1 : 8; }
// Decode attention asks for the K/V rows this many keys ahead of the ones it sums: all KV heads of a position are
// contiguous, so one head's rows are a strided stream the hardware prefetchers follow poorly (a decode step
// waited on most of its K/V loads; +12% at depth 512). A prefill re-reads each row from the caches: no prefetch.
// 64 keys ahead into L2 (locality 1) rather than 16 into L1: L1's few miss buffers held the prefetches back, and
// bench/cpu_attention (4k / 16k keys, bf16) read 15.0 / 13.2 -> 18.6 / 15.2 GB/s at 1 thread, 20.1 / 20.6 ->
// 25.5 / 21.8 at 2 (medians of 5, alternated; AMD EPYC, AVX-512).
constexpr int64_t kKvPrefetchKeys = 64;
inline bool attention_prefetches(int64_t query_rows) { return query_rows <= kAttentionDecodeRows; }
inline void prefetch_bytes(const void* p, int64_t bytes) {
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(static_cast<const char*>(p) + b, 0, 1);
}

inline void visible_key_range(const AttentionParams& p, int64_t qpos, int64_t S, int64_t& j0, int64_t& j1) {
  j0 = 0;
  j1 = S;
  if (p.k_pos) return;
  if (p.causal) j1 = std::clamp<int64_t>(qpos - p.k_pos0 + 1, 0, S);
  if (p.window > 0) j0 = std::clamp<int64_t>(qpos - p.window + 1 - p.k_pos0, 0, S);
}
// The AVX-512 attention (attention_avx512.cc): false, having done nothing, where the CPU lacks AVX-512 or the
// shapes are not covered (then attention() runs its AVX2 kernels).
bool attention_avx512(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, Tensor& out);
// The same kernel over quantized K/V read in place (4/8-bit, f32 scales, groups a power of two ≥ 16); false,
// having done nothing, where it does not apply.
bool attention_quantized_avx512(const Tensor& q, const QuantizedMatrix& k, const QuantizedMatrix& v, int64_t kv_heads,
                                const AttentionParams& p, Tensor& out);
void attention_quantized(const Tensor& q, const QuantizedMatrix& k, const QuantizedMatrix& v, int64_t kv_heads,
                         const AttentionParams& p, Tensor& out);
void rms_norm_gated(const Tensor& x, const Tensor& z, const Tensor& w, float eps, Tensor& out);
void l2_normalize(const Tensor& x, float eps, Tensor& out);
void sigmoid_mul(const Tensor& x, const Tensor& gate, Tensor& out);
void causal_conv1d_silu(const Tensor& x, const Tensor& weight, Tensor& state, Tensor& out, bool fast_exp = false);
void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                      Tensor& state, Tensor& out);
void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out, bool fast_exp = false);
void gelu_tanh_mul(const Tensor& gate, const Tensor& up, Tensor& out);

}  // namespace lathe::cpu
