// The CUDA side of ops.h: the same operations over device tensors, called by ops.cc when the inputs live on
// the GPU. Activations are F32 or BF16; outputs keep the input's type unless said otherwise. Only compiled
// with the CUDA backend (LATHE_HAVE_CUDA).
#pragma once
#include <vector>

#include "tensor/ops.h"

namespace lathe {
struct QkvStep;          // ops_extra.h
struct AppendSlot;       // ops_extra.h
struct DecodeKV;         // ops_extra.h
struct GraphTable;       // ops_extra.h
struct CopySegment;      // ops_extra.h
struct QuantAppendSlot;  // ops_extra.h
namespace cuda {
struct AttentionArgs;  // cuda/kernels.h
}
}  // namespace lathe

namespace lathe::gpu {

Tensor linear(const Tensor& x, const Weight& w, const Tensor* bias, bool f32_out);
Tensor embedding(const std::vector<int32_t>& ids, const Weight& table, DType out);
Tensor dequantize(const QuantizedMatrix& q, int64_t row0, int64_t n, DType out);
Tensor rms_norm(const Tensor& x, const Tensor& weight, float eps, bool plus_one, DType out);
void rope_inplace(Tensor& x, const RopeTable& rope, int64_t pos0);
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p);
// Decode steps read the codes in place (cuda/decode_attention.cu); else the cache is dequantized to q's type.
Tensor attention_quantized(const Tensor& q, const QuantizedMatrix& k, const QuantizedMatrix& v, int64_t kv_heads,
                           const AttentionParams& p);
Tensor gated(const Tensor& gate, const Tensor& up, bool gelu);
void add_inplace(Tensor& a, const Tensor& b);
void scale_inplace(Tensor& x, float s);
void softcap_inplace(Tensor& x, float cap);
Tensor argmax_rows_device(const Tensor& x);
void apply_logit_edits(Tensor& x, const std::vector<LogitEdit>& edits);
void apply_token_masks(Tensor& x, const std::vector<int32_t>& rows, const std::vector<uint64_t>& bits);
Tensor sample_rows_device(const Tensor& x, const std::vector<RowSampling>& rows);
void copy_rows(void* dst, int64_t dst_row, const void* src_rows, int64_t n, size_t row_bytes);
void copy_segments(const std::vector<CopySegment>& segs, const GraphTable* table);
// Where a batched op's row table of `bytes` is on the device: under a capture, the graph's table (written at its
// host staging, which each replay rewrites); else a fresh upload that `keep` holds until the launch is queued.
const void* row_table(const void* host, size_t bytes, const GraphTable* table, Tensor& keep);

// Newer families and cache kinds (ops_cuda_models.cc).
Tensor convert(const Tensor& x, DType t);
Tensor sigmoid_mul(const Tensor& x, const Tensor& gate);
Tensor l2_normalize(const Tensor& x, float eps);
// Output in z's type (the activation type: it feeds out_proj), f32 arithmetic.
Tensor rms_norm_gated(const Tensor& x, const Tensor& z, const Tensor& weight, float eps);
// Output F32 (it feeds the f32 recurrence).
Tensor causal_conv1d_silu(const Tensor& x, const Tensor& weight, Tensor& state);
Tensor gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                        Tensor& state);
void delta_gates(const Tensor& a, const Tensor& b, const Tensor& neg_a, const Tensor& dt_bias, Tensor& g, Tensor& beta);
void router_topk(const Tensor& scores, const Tensor& expert_scale, int64_t k, Tensor& idx, Tensor& weights);
Tensor gather_rows(const Tensor& x, const std::vector<int32_t>& idx);
void scatter_add_rows(Tensor& out, const std::vector<int32_t>& idx, const Tensor& x, const std::vector<float>& w);
QuantizedMatrix quantize_kv(const Tensor& x, int bits, int group_size);
Tensor rms_norm_rope(const Tensor& x, const Tensor& weight, float eps, bool plus_one, const RopeTable& rope,
                     int64_t pos0);
Tensor add_rms_norm(Tensor& h, const Tensor& b, const Tensor& weight, float eps, bool plus_one, DType out);
Tensor qkv_rope_append(const Tensor& y, const QkvStep& s, const RopeTable& rope, int64_t pos0, Tensor& keys,
                       Tensor& values, int64_t row);
Tensor qkv_rope_append_rows(const Tensor& y, const QkvStep& s, const RopeTable& rope,
                            const std::vector<AppendSlot>& slots, const GraphTable* table);
bool quantized_append_covers(int64_t head_dim, int bits, int group_size);
Tensor qkv_rope_append_quantized_rows(const Tensor& y, const QkvStep& s, const RopeTable& rope,
                                      const std::vector<QuantAppendSlot>& slots, int bits, int group_size,
                                      const GraphTable* table);
Tensor attention_decode_rows(const std::vector<DecodeKV>& rows, const AttentionParams& p, const GraphTable* table);
// Rows up to which a batched decode step keeps every row bitwise its solo run: the linears' GEMV boundary where
// dense copies serve the wider steps (8), or LATHE_CUDA_GEMV_ROWS. Wider steps' attention takes the
// one-block-per-row kernel (tensor/cuda/decode_attention_wide.h).
int64_t exact_decode_rows();
// A decode launch's K/V fields for quantized caches (rows token·kv_heads + head, codes read in place); false where
// the matrices' layout cannot be described (the caller then dequantizes).
bool quantized_kv_args(cuda::AttentionArgs& a, const QuantizedMatrix& k, const QuantizedMatrix& v, int64_t kv_heads);
// The same fields for K [S, Hkv, D] and V [S, Hkv, Dv] in q's type (element strides).
void dense_kv_args(cuda::AttentionArgs& a, const Tensor& k, const Tensor& v);

}  // namespace lathe::gpu
