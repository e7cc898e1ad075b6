// Launchers for the kernels of the newer model families and cache kinds (Gated DeltaNet, MoE routing, quantized
// KV), kept apart from kernels.h so the core kernels do not recompile when these change. Raw device pointers;
// f32 arithmetic; all work queued on cuda::stream().
#pragma once
#include <cstddef>
#include <cstdint>

#include "tensor/cuda/kernels.h"

namespace lathe::cuda {

// out = x * sigmoid(gate), n elements of type t.
void sigmoid_mul(const void* x, const void* gate, void* out, DType t, int64_t n);
// Each row of D values divided by sqrt(sum(x^2) + eps).
void l2_normalize(const void* x, DType t, void* out, int64_t rows, int64_t D, float eps);
// RMSNorm(x) * w * silu(z) per row of D; x, z and out may differ in type.
void rms_norm_gated(const void* x, DType xt, const void* z, DType zt, const float* w, void* out, DType ot, int64_t rows,
                    int64_t D, float eps);
// Depthwise causal conv1d (+ SiLU) over T steps of C channels, kernel K ≤ 8; state [K-1, C] f32 carries the
// window in and out; out [T, C] f32.
void causal_conv1d_silu(const void* x, DType xt, const float* w, float* state, float* out, int64_t T, int64_t C, int K);
// The gated delta rule over an f32 state [Hv, Dv, Dk] (Dk ≤ 256): see ops.h. All f32, contiguous.
void gated_delta_rule(const float* q, const float* k, const float* v, const float* g, const float* beta, float* state,
                      float* out, int64_t T, int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv);
// Per token and value head: g = neg_a * softplus(a + dt_bias), beta = sigmoid(b); a, b [T, H] of type t.
void delta_gates(const void* a, const void* b, DType t, const float* neg_a, const float* dt_bias, float* g, float* beta,
                 int64_t T, int64_t H);
// Softmax over E ≤ 256 scores per token, top-k (ties: lower expert), renormalised over the k, times
// expert_scale[expert]: idx/w [T, k].
void router_topk(const float* scores, const float* expert_scale, int64_t T, int64_t E, int64_t k, int32_t* idx,
                 float* w);
// out row i = x row idx[i] (rows of row_bytes, a multiple of 4).
void gather_rows(const void* x, const int32_t* idx, int64_t n, size_t row_bytes, void* out);
// out[idx[i]] += w[i] * x[i] over rows of D; out f32, x of type xt.
void scatter_add_rows(float* out, int64_t D, const int32_t* idx, const void* x, DType xt, const float* w, int64_t n);
// MLX affine quantization of rows [rows, cols] (cols a multiple of gs, gs·bits a multiple of 32): codes into
// w [rows, cols·bits/32], scales/biases [rows, cols/gs] of type st, as quant::quantize_kv_rows does.
void quantize_rows(const void* x, DType xt, int64_t rows, int64_t cols, int bits, int gs, uint32_t* w, void* scales,
                   void* biases, DType st);
// Any-geometry dequantization (KV caches: groups as small as 16 values) into a dense [rows, cols] of type ot.
void dequantize_any(const QuantView& q, void* out, DType ot);

// Fused per-layer kernels (decode is launch-bound: each saves a launch per layer; fused.cu).
// out = RMSNorm(x) per head row of D, then RoPE (pairs i, i + dims/2 over the first `dims`) at position
// pos0 + t + *step_delta(); x, out [T, H, D] of type t; inv_freq a host array of dims/2 entries.
void rms_norm_rope(const void* x, void* out, DType t, int64_t T, int64_t H, int64_t D, const float* w, float eps,
                   bool plus_one, const float* inv_freq, int dims, float scaling, int64_t pos0);
// One decode token: q heads (normed when `norm`, roped) to q_out [Hq, D]; k heads likewise and v heads copied
// into row `row` (+ the replay delta) of the key/value cache buffers [capacity, Hkv, D]. y: [(Hq + 2·Hkv)·D].
void qkv_rope_append(const void* y, void* q_out, void* keys, void* values, DType t, int64_t row, int64_t Hq,
                     int64_t Hkv, int64_t D, bool norm, const float* q_w, const float* k_w, float eps, bool plus_one,
                     const float* inv_freq, int dims, float scaling, int64_t pos0);
// The same for a batched decode step of n_rows rows (one launch): y [n_rows, (Hq + 2·Hkv)·D], q_out
// [n_rows, Hq, D]; rows (device array) names each row's cache buffers, row and position. Row r's results are
// bitwise what qkv_rope_append gives it alone.
struct AppendRow {
  void *keys = nullptr, *values = nullptr;
  int64_t row = 0, pos0 = 0;
};
void qkv_rope_append_rows(const void* y, void* q_out, const AppendRow* rows, int64_t n_rows, DType t, int64_t Hq,
                          int64_t Hkv, int64_t D, bool norm, const float* q_w, const float* k_w, float eps,
                          bool plus_one, const float* inv_freq, int dims, float scaling);
// The same over quantized caches (4/8-bit, groups of 32 or 64 that divide D): each row's k and v heads quantized
// as quantize_rows does and written to dst (key codes, scales, biases, value codes, scales, biases: the token's
// row of each part [Hkv, ...], scales and biases of type t), bitwise what staging them and quantize_rows give.
struct QuantAppendRow {
  void* dst[6] = {};
  int64_t pos0 = 0;
};
bool qkv_rope_append_quantized_covers(int64_t D, int bits, int group_size);
void qkv_rope_append_quantized_rows(const void* y, void* q_out, const QuantAppendRow* rows, int64_t n_rows, DType t,
                                    int64_t Hq, int64_t Hkv, int64_t D, int bits, int group_size, bool norm,
                                    const float* q_w, const float* k_w, float eps, bool plus_one, const float* inv_freq,
                                    int dims, float scaling);
// h += b (h F32 or BF16, b any activation type), then out = RMSNorm(h) of type ot; rows of D.
void add_rms_norm(void* h, DType ht, const void* b, DType bt, void* out, DType ot, int64_t rows, int64_t D,
                  const float* w, float eps, bool plus_one);

}  // namespace lathe::cuda
