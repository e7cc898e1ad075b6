// Single-query attention for decode steps over bf16 K/V (decode_attention.cu): all query heads of a kv head
// in one block, fixed splits merged by the last block of each kv head.
#pragma once
#include "tensor/cuda/kernels.h"

namespace lathe::cuda {

// Whether the kernel covers these arguments (one query, bf16, ≤ 8 query heads per kv head, power-of-two head
// sizes, 16-byte aligned rows).
bool decode_attention_applies(const AttentionArgs& a);
// Splits of the key range (from the kv-head count alone, so a captured step stays valid as the context grows).
int decode_attention_splits(const AttentionArgs& a);
// part: splits > 1: [Hq][splits][Dv + 4] floats of partials; unused with one split.
void decode_attention(const AttentionArgs& a, int splits, float* part);

}  // namespace lathe::cuda
