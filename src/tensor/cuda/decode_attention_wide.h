// Decode attention for batches whose rows alone fill the chip (decode_attention_wide.cu): one block per
// (row, kv head), no key splits. Its sums run in another order than the split kernel's, so a row's output is
// close to, not bitwise, its solo launch: the dispatch (ops_cuda_decode_rows.cc) takes it only above the rows
// where the batched linears are bitwise their solo runs anyway.
#pragma once
#include "tensor/cuda/decode_attention.h"

namespace lathe::cuda {

// Whether the kernel covers these shapes (bf16, ≤ 8 query heads per kv head, head sizes ≤ 256, value heads
// 64/128/256) and n_rows × kv heads blocks cover the SMs.
bool decode_attention_wide_applies(const AttentionArgs& a, int64_t n_rows);
// As decode_attention_rows (same row table and output), without partials.
void decode_attention_wide(const AttentionArgs& a, const DecodeRow* rows, int64_t n_rows);

}  // namespace lathe::cuda
