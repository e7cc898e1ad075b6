// Ops added for the newer model families and cache kinds, beside ops.h (kept apart so adding them does not
// rebuild everything that includes ops.h): a type conversion, the Gated DeltaNet gates, the MoE router's top-k
// and KV-row quantization. Each runs on the device of its first tensor.
#pragma once
#include <cstdint>
#include <vector>

#include "tensor/ops.h"

namespace lathe {

// x converted to `t` (a copy; x itself when it already has that type). The CPU keeps activations F32.
Tensor convert(const Tensor& x, DType t);

// Per token and value head: g = neg_a · softplus(a + dt_bias) (log-space decay), beta = sigmoid(b).
// a, b: [T, H]; neg_a = −exp(A_log), dt_bias: F32 [H]. g and beta come back F32 [T, H].
void delta_gates(const Tensor& a, const Tensor& b, const Tensor& neg_a, const Tensor& dt_bias, Tensor& g, Tensor& beta);

// Router picks: softmax over scores [T, E] (F32), the k most probable experts (ties: lower index), their
// probabilities renormalised over the k and multiplied by expert_scale[e] (F32 [E]). idx I32 [T, k] and
// weights F32 [T, k] on the scores' device.
void router_topk(const Tensor& scores, const Tensor& expert_scale, int64_t k, Tensor& idx, Tensor& weights);

// MLX affine quantization of KV rows x [rows, cols] (quant::quantize_kv_rows): on the CPU x is F32 and scales
// are F32; on CUDA scales/biases take x's type (F32 or BF16), as MLX keeps them in the activations' type.
QuantizedMatrix quantize_kv(const Tensor& x, int bits, int group_size);

// Fusions of two ops.h calls into one pass (one launch on CUDA; the two calls on the CPU):
// rms_norm(x, weight, eps, plus_one) followed by rope_inplace(·, rope, pos0), for x [T, H, D]; x's type.
Tensor rms_norm_rope(const Tensor& x, const Tensor& weight, float eps, bool plus_one, const RopeTable& rope,
                     int64_t pos0);
// add_inplace(h, b) followed by rms_norm(h, weight, eps, plus_one, out).
Tensor add_rms_norm(Tensor& h, const Tensor& b, const Tensor& weight, float eps, bool plus_one, DType out);

// One decode token's attention inputs from the stacked projection y [1, (Hq + 2·Hkv)·D] (q heads, k heads,
// v heads): returns the q heads [1, Hq, D] and writes the k heads and v heads into row `row` of the caches'
// buffers keys/values [capacity, Hkv, D]. With `norm`, q and k heads are RMSNormed first (q_w / k_w, eps,
// plus_one), as rms_norm_rope; both are roped at pos0. Equals those ops followed by copy_rows into the buffers
// (one launch on CUDA instead of four).
struct QkvStep {
  int64_t q_heads = 0, kv_heads = 0, head_dim = 0;
  bool norm = false;
  Tensor q_w, k_w;
  float eps = 1e-6f;
  bool plus_one = false;
};
Tensor qkv_rope_append(const Tensor& y, const QkvStep& s, const RopeTable& rope, int64_t pos0, Tensor& keys,
                       Tensor& values, int64_t row);

// Batched decode steps ([core]): one launch for all rows instead of one per row, each row's result bitwise
// what the per-row op gives it alone (so batched greedy equals solo greedy). Both return an undefined tensor,
// having done nothing, where only the per-row ops apply (the CPU, f32 activations, shapes past the kernels).
//
// Whether Attention takes these batched kernels for a device step of decode rows: on (checked on the H200:
// tests/cuda/decode_rows_test.cc bitwise, bench/cuda_e2e --batch 64 rows 1,004 -> 2,691 tok/s);
// LATHE_BATCHED_DECODE=0 runs each row's solo kernels instead, for comparisons.
bool batched_decode_enabled();
void set_batched_decode_enabled(bool on);
// Row r's new token goes to row `row` of its cache buffers [capacity, Hkv, D], at position `pos`.
struct AppendSlot {
  Tensor* keys = nullptr;
  Tensor* values = nullptr;
  int64_t row = 0, pos = 0;
};
// Where a batched op's row table goes while a batched decode step is captured into a graph
// (model/batch_graph.h): the op writes it at `host` (pinned staging that each replay rewrites and uploads) and
// its kernel reads it at `dev`. The attention then launches blocks for every key split, so a replay at a
// longer context stays covered.
struct GraphTable {
  void* host = nullptr;
  const void* dev = nullptr;
};
// Device-to-device copies of many small segments in one launch (a batched step's per-row cache writes).
struct CopySegment {
  const void* src = nullptr;
  void* dst = nullptr;
  int64_t bytes = 0;
};
// Whether copy_segments can serve device pointers here (a CUDA build with a device in use).
bool copy_segments_available(Device d);
// table: under a batched graph capture, where the segment list goes (replays rewrite its destinations).
void copy_segments(const std::vector<CopySegment>& segs, const GraphTable* table = nullptr);
// Rows a batched device decode step may have and stay bitwise its rows' solo steps (0 without CUDA).
int64_t exact_batched_decode_rows();

// qkv_rope_append over y [B, (Hq + 2·Hkv)·D], one slot per row: returns q [B, Hq, D].
Tensor qkv_rope_append_rows(const Tensor& y, const QkvStep& s, const RopeTable& rope,
                            const std::vector<AppendSlot>& slots, const GraphTable* table = nullptr);
// qkv_rope_append_rows over quantized caches: each row's k and v heads quantized (bits, group_size, scales and
// biases in y's type) straight into its destinations — dst: the token's row of key codes, scales, biases, value
// codes, scales, biases — at position pos. Undefined where the fused kernel does not cover the geometry
// (quantized_append_covers; nothing written then). table: under a batched graph capture, as above.
struct QuantAppendSlot {
  void* dst[6] = {};
  int64_t pos = 0;
};
bool quantized_append_covers(Device d, int64_t head_dim, int bits, int group_size);
Tensor qkv_rope_append_quantized_rows(const Tensor& y, const QkvStep& s, const RopeTable& rope,
                                      const std::vector<QuantAppendSlot>& slots, int bits, int group_size,
                                      const GraphTable* table = nullptr);
// One row of a batched decode attention: its query [1, Hq, D] and keys/values as attention() (dense k, v
// [S, Hkv, D]) or attention_quantized() (qk, qv, kv_heads) takes them, with its own positions.
struct DecodeKV {
  Tensor q;
  // The row's keys and values (or their quantized forms), owned by the caller for the call: pointers, not
  // copies (copying four tensors per row and layer was ~10% of the host's time in a 64-row device step).
  const Tensor* k = nullptr;
  const Tensor* v = nullptr;
  bool quantized = false;
  const QuantizedMatrix* qk = nullptr;
  const QuantizedMatrix* qv = nullptr;
  int64_t kv_heads = 0;
  int64_t q_pos0 = 0, k_pos0 = 0;
  const std::vector<int64_t>* k_pos = nullptr;  // explicit key positions (ring buffers)
};
// attention() of every row: [B, Hq, Dv]. p gives scale, softcap, window and causality; positions come from
// the rows.
Tensor attention_decode_rows(const std::vector<DecodeKV>& rows, const AttentionParams& p,
                             const GraphTable* table = nullptr);

}  // namespace lathe
