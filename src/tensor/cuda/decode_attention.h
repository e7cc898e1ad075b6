// Single-query attention for decode steps over bf16 K/V (decode_attention.cu): all query heads of a kv head
// in one block, fixed splits merged by the last block of each kv head.
#pragma once
#include "tensor/cuda/kernels.h"

namespace lathe::cuda {

// Whether the kernel covers these arguments (one query, bf16, ≤ 8 query heads per kv head, power-of-two head
// sizes, aligned rows; K/V bf16, or 4/8-bit codes with bf16 scales and biases in groups of a multiple of 8).
// Quantized K/V are dequantized in registers with the arithmetic of dequantize_any, so the result is bitwise
// that of dequantizing the cache to bf16 first and attending over it.
bool decode_attention_applies(const AttentionArgs& a);
// Splits of the key range (from the kv-head count alone, so a captured step stays valid as the context grows).
int decode_attention_splits(const AttentionArgs& a);
// part: splits > 1: [Hq][splits][Dv + 4] floats of partials; unused with one split.
void decode_attention(const AttentionArgs& a, int splits, float* part);

// One row of a batched decode step: its query [Hq, D], keys/values (row strides from AttentionArgs), context
// length, query position and key positions (k_pos: device array [S], else linear from k_pos0).
struct DecodeRow {
  const void *q = nullptr, *k = nullptr, *v = nullptr;
  const int64_t* k_pos = nullptr;
  int64_t S = 0, q_pos0 = 0, k_pos0 = 0;
  // With AttentionArgs::kv_bits: the row's scales and biases (k and v are then its codes).
  const void *k_scales = nullptr, *k_biases = nullptr, *v_scales = nullptr, *v_biases = nullptr;
};
// Rows one launch may carry (the split counters are per row and kv head).
int64_t decode_attention_max_rows(const AttentionArgs& a);
// All rows in one launch: a carries the shared shape, strides, scale, softcap, window and causality (its q, k,
// v, S and positions are ignored), rows is a device array [n_rows], out [n_rows, Hq, Dv]; part:
// [n_rows][Hq][splits][Dv + 4] with splits > 1. Row r's output is bitwise its solo decode_attention's.
// max_active: the most splits any row's context fills (decode_attention_active_splits of its S): blocks are
// launched for those only (a 64-row step at context ~200 used 13 of 33 splits; the rest only exited).
void decode_attention_rows(const AttentionArgs& a, const DecodeRow* rows, int64_t n_rows, int splits, int max_active,
                           float* part);
// The splits that hold keys for a context of S keys (the rest exit at once).
int decode_attention_active_splits(int64_t S, int splits);
// LATHE_CUDA_DECODE_ATTN=0: decode steps take the per-head kernel (attention.cu), for comparisons.
bool decode_attention_off();
// Whether decode attention reads quantized caches in place (the default since session 26's H100 run: bitwise
// the dequantized result, 8-bit K/V decode of the 4B shape 1.32x faster at 4k tokens, 1.87x at 16k);
// LATHE_CUDA_KV_IN_PLACE=0 dequantizes the cache for every decode step instead, for comparisons.
bool kv_in_place_on();

}  // namespace lathe::cuda
