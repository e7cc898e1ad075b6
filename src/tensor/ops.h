// The operations a decoder needs, as free functions over Tensors. Each dispatches on the device of its
// inputs (CPU kernels in tensor/cpu/, CUDA kernels in tensor/cuda/). Activations are [T, features] rows;
// the CPU computes them in f32; on CUDA they are F32 or BF16 (f32 accumulation), and outputs keep the input's
// element type unless an op says otherwise.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "tensor/logit_edit.h"
#include "tensor/row_sampling.h"
#include "tensor/tensor.h"

namespace lathe {

namespace cpu {
struct PackedQuant;
}

// MLX affine-quantized matrix [rows, cols]: `w` is U32 [rows, cols*bits/32] (element j of each word at
// bit offset bits*j), `scales`/`biases` are bf16/f16/f32 [rows, cols/group_size]; value = scale*q + bias.
struct QuantizedMatrix {
  Tensor w, scales, biases;
  int bits = 4;
  int group_size = 64;
  // The CPU integer-dot layout of these rows (tensor/cpu/packed_quant.h), set by pack_for_cpu at load; rows
  // start at cpu_packed_row0 of it (a row slice shares its parent's packing). Null: the exact f32 kernels.
  std::shared_ptr<const cpu::PackedQuant> cpu_packed = nullptr;
  int64_t cpu_packed_row0 = 0;
  int64_t rows() const { return w.dim(0); }
  int64_t cols() const { return w.dim(1) * 32 / bits; }
};

// Repacks a CPU weight once for the integer-dot kernels (activations quantized per group to int8, or with
// act_bits 16 to 16-bit integers run as two int8 rows: cpu/packed_quant.h); leaves cpu_packed null where they do
// not apply. Weights without it run the exact f32 kernels (--exact).
void pack_for_cpu(QuantizedMatrix& q, int act_bits = 8);

// A linear layer's weight [out, in]: dense (f32/bf16/f16) or quantized.
struct Weight {
  Tensor dense;
  QuantizedMatrix q;
  bool quantized = false;
  int64_t out_features() const { return quantized ? q.rows() : dense.dim(0); }
  int64_t in_features() const { return quantized ? q.cols() : dense.dim(1); }
  Device device() const { return quantized ? q.w.device() : dense.device(); }
};

// y = x · Wᵀ (+ bias). x: [M, in]; returns [M, out] in x's type, or F32 with f32_out (logits).
Tensor linear(const Tensor& x, const Weight& w, const Tensor* bias = nullptr, bool f32_out = false);
// linear() of several weights over the same x (biases[i] for ws[i], or none), each output bitwise its own
// linear() call's. On the CPU's packed path the weights that can share it quantize x once and run in one
// parallel region (q|k|v: one quantization pass and one barrier instead of three).
std::vector<Tensor> linear_many(const Tensor& x, const std::vector<const Weight*>& ws,
                                const std::vector<const Tensor*>& biases = {}, bool f32_out = false);
// Row gather: returns [ids.size(), dim] of type `out` (F32 on the CPU) from a dense or quantized table
// [vocab, dim], on the table's device.
Tensor embedding(const std::vector<int32_t>& ids, const Weight& table, DType out = DType::F32);
// Dequantize rows [row0, row0+n) of a quantized matrix to f32 [n, cols].
Tensor dequantize(const QuantizedMatrix& q, int64_t row0 = 0, int64_t n = -1);

// RMSNorm over the last dim; weight may be undefined (weightless); plus_one uses (1 + w) (Gemma). The output
// has x's type, or `out` when given (CUDA: an F32 residual stream normalised into BF16 matmul inputs).
Tensor rms_norm(const Tensor& x, const Tensor& weight, float eps, bool plus_one = false,
                std::optional<DType> out = std::nullopt);

// Rotary embedding with rotate-half pairing (i, i + dims/2) over the first `dims` features of each head.
// inv_freq has dims/2 entries (0 means identity for that pair).
struct RopeTable {
  int dims = 0;
  std::vector<float> inv_freq;
  float attention_scaling = 1.0f;  // multiplies cos/sin (yarn-style mscale); 1 for the common types
};
// x: [T, heads, head_dim] f32 contiguous, token t at position pos0 + t. In place.
void rope_inplace(Tensor& x, const RopeTable& rope, int64_t pos0);

// Scaled dot-product attention with GQA. q: [T, Hq, D]; k: [S, Hkv, D]; v: [S, Hkv, Dv] (views allowed).
// Query t sits at position q_pos0 + t; key j at k_pos[j] when given, else k_pos0 + j. A key is visible
// when its position ≤ the query's (causal) and, with window > 0, query_pos - key_pos < window.
struct AttentionParams {
  float scale = 1.0f;
  float softcap = 0.0f;  // 0 = off; else scores = tanh(s / cap) * cap
  int64_t window = 0;
  bool causal = true;
  int64_t q_pos0 = 0;
  int64_t k_pos0 = 0;
  const std::vector<int64_t>* k_pos = nullptr;
};
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p);

// Attention over MLX affine-quantized keys/values: k and v are [S * kv_heads, D] quantized along D (row
// s * kv_heads + h holds key s of head h). Same visibility rules and output as attention().
Tensor attention_quantized(const Tensor& q, const QuantizedMatrix& k, const QuantizedMatrix& v, int64_t kv_heads,
                           const AttentionParams& p);

// Gated activations: act(gate) * up, elementwise. gelu is the tanh approximation. fast_exp (CPU): a polynomial
// exp within a few ulp instead of libm's, for the default int8 path (its activations are already rounded to 8
// bits); the exact path keeps libm.
Tensor silu_mul(const Tensor& gate, const Tensor& up, bool fast_exp = false);
Tensor gelu_tanh_mul(const Tensor& gate, const Tensor& up);

// x * sigmoid(gate), elementwise (Qwen3.5 attention output gate).
Tensor sigmoid_mul(const Tensor& x, const Tensor& gate);
// x / sqrt(sum(x^2) + eps) over the last dim.
Tensor l2_normalize(const Tensor& x, float eps);
// RMSNorm(x) * weight * silu(z) over the last dim (gated RMSNorm of Gated DeltaNet); x and z same shape.
Tensor rms_norm_gated(const Tensor& x, const Tensor& z, const Tensor& weight, float eps);

// Depthwise causal conv1d + SiLU over time. x: [T, C]; weight: [C, K] f32; state: [K-1, C] f32, the inputs
// before x (zeros at the start), replaced by the last K-1 inputs on return. Returns [T, C].
// fast_exp: the CPU's silu takes the polynomial exp (the default path's, as GatedMLP's does); the device ignores it.
Tensor causal_conv1d_silu(const Tensor& x, const Tensor& weight, Tensor& state, bool fast_exp = false);
// Gated delta rule, one step per token with an f32 state S [Hv, Dv, Dk] updated in place:
//   S *= exp(g_t); d = (v_t - S k_t) * beta_t; S += d k_tᵀ; y_t = S q_t.
// q, k: [T, Hk, Dk] (v head h reads k head h / (Hv/Hk)); v: [T, Hv, Dv]; g, beta: [T, Hv]. Returns [T, Hv, Dv].
Tensor gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                        Tensor& state);

// Rows of x [N, D] picked by idx: [idx.size(), D].
Tensor gather_rows(const Tensor& x, const std::vector<int32_t>& idx);
// out[idx[i]] += w[i] * x[i] for rows of x [n, D] into out [N, D].
void scatter_add_rows(Tensor& out, const std::vector<int32_t>& idx, const Tensor& x, const std::vector<float>& w);

Tensor add(const Tensor& a, const Tensor& b);
void add_inplace(Tensor& a, const Tensor& b);  // on CUDA b may be BF16 while a is F32
void scale_inplace(Tensor& x, float s);
void softcap_inplace(Tensor& x, float cap);  // tanh(x / cap) * cap
// Index of the largest value of each row of a [rows, cols] tensor (first on ties).
std::vector<int32_t> argmax_rows(const Tensor& x);
// The same on x's device without the copy back (CUDA only): I32 [rows], for a next step that reads its ids there.
Tensor argmax_rows_device(const Tensor& x);
// x (contiguous F32) at each edit's flat index = apply_logit_edit(x, edit); indices distinct and in range.
void apply_logit_edits(Tensor& x, const std::vector<LogitEdit>& edits);
// Allowed-token masks (structured outputs) over x (contiguous F32 [R, V]): for the k-th listed row, bits
// [k · ⌈V/64⌉, (k + 1) · ⌈V/64⌉) hold one bit per token (bit t % 64 of word t / 64); a clear bit sets that
// logit to -inf. Rows distinct and in range.
void apply_token_masks(Tensor& x, const std::vector<int32_t>& rows, const std::vector<uint64_t>& bits);
// One token a row of x (contiguous F32 [R, V] on CUDA), drawn as the host Sampler draws it from each row's
// settings (tensor/row_sampling.h; the CPU has the Sampler itself, so this is CUDA only). The token's
// log-probability goes to logprobs.
std::vector<int32_t> sample_rows(const Tensor& x, const std::vector<RowSampling>& rows, std::vector<float>& logprobs);
// The same without the copy back: I32 [2R] on the device, the tokens then their log-probabilities' f32 bits.
Tensor sample_rows_device(const Tensor& x, const std::vector<RowSampling>& rows);
// Copies rows [src_row, src_row + n) of src (outer dim) to rows from dst_row of dst, on their device
// (both on one device; equal types, or on the CPU F32 rows into BF16 ones, rounded as Tensor::to; equal
// numbers of elements a row; dst contiguous).
void copy_rows(Tensor& dst, int64_t dst_row, const Tensor& src, int64_t src_row, int64_t n);

}  // namespace lathe
