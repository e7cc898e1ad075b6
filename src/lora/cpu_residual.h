// The CPU kernel of the LoRA residual on the default path: y[t] += Σ_f scale_f · (x[t]·A_fᵀ)·B_fᵀ over the
// factors of one site, with the factors in BF16 (half the bytes of F32; `--exact` keeps the F32 route of
// forward_context.cc, which the parity suites use). A is kept [r, in] (r dot products per row) and B
// transposed, [r, out], so the second step streams down the output columns with no horizontal sums and every
// stacked factor's share is summed in registers before y is touched once.
//
// One call serves every slot group of a forward (a mixed batch is one pass, not one per adapter set). A row's
// result never depends on the other rows of the call or on the thread split: a decode step gets bit for bit
// what the same row gets inside a batch, which is what lets mixed batches match solo runs. Tiny work runs on the
// calling thread. A decode step (or a small batch) is one pool region: each thread computes all of x·Aᵀ itself
// (small; both threads read A at the same time) and then its share of the output columns, so the factors are
// read at the bandwidth of all threads with one wake-up per site. Larger work (prefill) splits the dots over
// the pool, then the columns.
#pragma once
#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace lathe::lora {

struct CpuFactor {
  int64_t rank = 0, in = 0, out = 0;
  float scale = 1.0f;
  std::vector<uint16_t> a;   // BF16 [rank, in]
  std::vector<uint16_t> bt;  // BF16 [rank, out] (B transposed)
  size_t bytes() const { return (a.size() + bt.size()) * sizeof(uint16_t); }
};

// From the F32 factors as read from the file: a [r, in], b [out, r].
CpuFactor make_cpu_factor(const Tensor& a, const Tensor& b, float scale);

// Rows of x (and y) that add the residuals of one factor list (stacked adapters, summed in order).
struct CpuRowGroup {
  const std::vector<const CpuFactor*>* factors = nullptr;  // all with the same in and out
  const int32_t* rows = nullptr;                           // null: rows 0..n-1
  int64_t n = 0;
};

// For every group and row t of it: y[t] += Σ_f scale_f · (x[t]·A_fᵀ)·B_fᵀ. x: F32 rows of `in` floats with
// stride ldx; y: F32 rows of `out` floats with stride ldy.
void add_cpu_residual(const std::vector<CpuRowGroup>& groups, const float* x, int64_t ldx, float* y, int64_t ldy);

// Work (multiply-adds) below which a call stays on the calling thread (default 16384; LATHE_LORA_INLINE_MACS).
int64_t cpu_residual_inline_macs();
// Tests: the inline bound and the x·Aᵀ work up to which every thread computes all of u (default 2^20;
// LATHE_LORA_SHARED_DOT_MACS, read with LATHE_LORA_INLINE_MACS on the first call).
void set_cpu_residual_split(int64_t inline_macs, int64_t redundant_dot_macs);

}  // namespace lathe::lora
