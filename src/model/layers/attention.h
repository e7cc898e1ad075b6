// Multi-head attention with GQA: q/k/v projections (optional bias), optional per-head q/k RMSNorm, RoPE,
// causal or sliding-window softmax attention through a layer cache, output projection. Variants used by
// newer families: a weightless v norm and K reused as V (Gemma 4), a sigmoid output gate carried by q_proj
// (Qwen3.5), and KV-shared layers that attend over another layer's K/V (Gemma 4).
#pragma once
#include <string>
#include <vector>

#include "cache/layer_cache.h"
#include "model/batch_rows.h"
#include "model/layers/modules.h"
#include "tensor/ops_extra.h"

namespace lathe {

struct BatchGraphLayer;  // model/batch_graph.h
struct RowTensors;       // cache/row_tensors.h

struct AttentionSpec {
  int64_t hidden = 0, heads = 0, kv_heads = 0, head_dim = 0;
  bool qkv_bias = false, o_bias = false;
  bool qk_norm = false;
  bool norm_plus_one = false;
  bool v_norm = false;     // weightless RMSNorm on V (Gemma 4)
  bool k_eq_v = false;     // no v_proj: V is the k_proj output (normed, not roped)
  bool q_gate = false;     // q_proj emits [query | gate] per head; output *= sigmoid(gate) (Qwen3.5)
  bool kv_shared = false;  // no k/v projections: attends over a donor layer's K/V
  float norm_eps = 1e-6f;
  float scale = 1.0f;
  float softcap = 0.0f;
  int64_t window = 0;    // > 0 for sliding layers
  bool f32_out = false;  // o_proj emits F32 whatever the activation type (added to an F32 residual unrounded)
  RopeTable rope;
};

// Softmax attention of q [T, H, D] over what a cache update returned (f32 or quantized K/V).
Tensor attend(const Tensor& q, const KVView& kv, const AttentionParams& params);

// Layer steps whose quantized caches took one batched append (Attention::decode_rows_quantized) in this
// process (tests).
int64_t batched_quantized_kv_appends();

class Attention {
 public:
  Attention() = default;
  Attention(WeightBinder& b, const std::string& prefix, const AttentionSpec& spec);
  // x: [T, hidden]; returns [T, hidden]. Positions continue from cache.offset(). When kv_out is given it
  // receives the K/V view this layer attended over (for KV-shared layers later in the same forward).
  Tensor forward(const Tensor& x, LayerCache& cache, KVView* kv_out = nullptr) const;
  // A KV-shared layer: queries at positions pos0.. attend over a donor's view from the same forward.
  Tensor forward_shared(const Tensor& x, const KVView& kv, int64_t pos0) const;
  // Batched: x [N, hidden] holds the rows of s; caches[r] is row r's cache of this layer. The projections run
  // once over all rows, RoPE, cache writes and attention per row at its own positions. kv_out (when given)
  // receives each row's view. One row takes forward()'s path (the decode fast path, graphs).
  Tensor forward_rows(const Tensor& x, const RowSpans& s, const std::vector<LayerCache*>& caches,
                      std::vector<KVView>* kv_out = nullptr) const;
  // Batched KV-shared layer: row r's queries attend over kv[r], a donor's view from the same forward.
  Tensor forward_shared_rows(const Tensor& x, const RowSpans& s, const std::vector<KVView>& kv) const;
  const AttentionSpec& spec() const { return spec_; }

 private:
  // q: the q_proj output [T, q_out]; returns the normed, roped query heads (and the gate of a q_gate layer).
  Tensor project_q(const Tensor& q, int64_t pos0, Tensor* gate) const;
  Tensor finish(const Tensor& q, const Tensor& gate, const KVView& kv, int64_t pos0) const;
  // Attention of one row's queries over its view, gated where the layer has a gate: [T, heads · head_dim].
  Tensor attend_heads(const Tensor& q, const Tensor& gate, const KVView& kv, int64_t pos0) const;
  // One row's keys and values from its k/v projections [T, kv_out] (normed, roped at pos0).
  void project_kv(const Tensor& k_lin, const Tensor& v_lin, int64_t pos0, Tensor& k, Tensor& v) const;
  Tensor out_proj(const Tensor& heads) const;
  // q, k and v (q and k with k_eq_v) over x as separate outputs, each with its own LoRA residual (x quantized
  // once for all on the CPU).
  std::vector<Tensor> project_lin(const Tensor& x) const;
  // The fused q|k|v output's LoRA group (column ranges of q, k, v in the stacked projection).
  LoraGroup qkv_group() const;
  // linear(x, qkv_) plus the adapters' residuals (lora::group_fusable said yes).
  Tensor qkv_fused(const Tensor& x) const;
  // One decode token from its stacked q|k|v projection y [1, q+k+v]: on a device the fused norm + RoPE + KV
  // append (qkv_rope_append), else the column slices through update(). Returns the attended heads (pre-o_proj).
  Tensor decode_heads(const Tensor& y, LayerCache& cache, KVView* kv_out) const;
  // A device step of decode rows only, from the stacked projection y [B, q+k+v]: one batched norm + RoPE +
  // KV append (when every row's cache takes direct writes, else each row's update()), then one batched decode
  // attention; per-row launches only where the batched kernels do not apply. Each row's heads are bitwise
  // its decode_heads() result. Returns [B, heads · head_dim].
  Tensor decode_rows(const Tensor& y, const std::vector<LayerCache*>& caches, std::vector<KVView>* kv_out) const;
  AttentionParams params() const;  // scale, softcap and window of this layer's attention
  // Rows of any length (prefill chunks, decode tokens) on a device whose caches take direct writes: one q|k|v
  // projection over x [N, hidden], one fused norm + RoPE + K/V write for every token of every row (the decode
  // step's kernel, so a row's cache holds the same bits whichever way it was fed), then each row's attention.
  // A 64-prompt admission step otherwise ran ~6 launches a row a layer. Returns the attended heads
  // [N, heads · head_dim]; undefined where it does not apply (nothing changed then).
  Tensor prefill_direct(const Tensor& x, const std::vector<int64_t>& len, const std::vector<LayerCache*>& caches,
                        std::vector<KVView>* kv_out) const;
  // A device decode step (solo or batched) over quantized caches: one batched norm + RoPE into staging rows,
  // one quantization, one batched copy into every cache's next row. Undefined where it does not apply (nothing
  // changed then).
  Tensor decode_rows_quantized(const Tensor& y, const std::vector<LayerCache*>& caches, const std::vector<int64_t>& pos,
                               std::vector<KVView>* kv_out) const;
  // decode_rows_quantized's parts, shared with its captured form: the fused norm + RoPE of the rows into
  // staging rows ks/vs [B, Hkv, D] (returns q [B, Hq, D]; undefined where it does not apply), and the copy of
  // their quantized form into each row's destination. table: the tables of a batch graph capture.
  Tensor stage_rows(const Tensor& y, const std::vector<int64_t>& pos, const GraphTable* table, Tensor& ks,
                    Tensor& vs) const;
  // The fused form of both (one launch: norm + RoPE, quantization, writes to dest); undefined where its kernel
  // does not cover the geometry.
  Tensor append_quantized_fused(const Tensor& y, const std::vector<QuantizedRowDest>& dest,
                                const std::vector<int64_t>& pos, int bits, int group_size,
                                const GraphTable* table) const;
  static void copy_quantized_rows(const RowTensors& quantized, const std::vector<QuantizedRowDest>& dest,
                                  const GraphTable* table);
  // The batched decode attention over the rows' q and cache views (per-row launches where it does not apply;
  // under a capture, with its table, the batched kernel or an Unsupported error).
  Tensor attend_rows(std::vector<DecodeKV>& rows, std::vector<KVView>& views, const std::vector<int64_t>& pos,
                     std::vector<KVView>* kv_out, const GraphTable* table = nullptr) const;
  Tensor decode_rows_captured(const Tensor& y, const std::vector<LayerCache*>& caches,
                              std::vector<KVView>* kv_out) const;
  Tensor decode_rows_captured_quantized(const Tensor& y, BatchGraphLayer& t) const;
  AttentionSpec spec_;
  Linear q_, k_, v_, o_;
  Weight qkv_;  // on a device: q, k (and v) stacked (one GEMV); q_/k_/v_ are then row views of it
  bool fused_qkv_ = false;
  RMSNorm q_norm_, k_norm_, v_norm_;
  // Decode fast path (qkv_rope_append into the cache row): set up once at load; direct_ when this layer's
  // shape allows it (stacked q|k|v, no q gate, no K-as-V, no v norm).
  bool direct_ = false;
  QkvStep direct_step_;
};

}  // namespace lathe
