#include "model/decoder.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "common/log.h"
#include "lora/batch_scope.h"
#include "model/layers/rope.h"
#include "tensor/ops_extra.h"

namespace lathe {

DecoderModel::DecoderModel(ModelConfig config, Checkpoint ckpt, const DecoderSpec& spec)
    : Model(std::move(config), std::move(ckpt)), spec_(spec) {
  const ModelConfig& c = config_;
  WeightBinder b(ckpt_, c);
  const float eps = static_cast<float>(c.rms_norm_eps);
  embed_ = b.embedding("model.embed_tokens", c.vocab_size, c.hidden_size);
  const bool tied = c.tie_word_embeddings || !ckpt_.has("lm_head.weight");
  lm_head_ = tied ? embed_ : b.linear("lm_head", c.vocab_size, c.hidden_size);
  final_norm_ = {b.tensor("model.norm.weight", {c.hidden_size}), eps, spec.norm_plus_one};
  layers_.resize(static_cast<size_t>(c.num_layers));
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i);
    Layer& L = layers_[static_cast<size_t>(i)];
    const std::string& type = c.layer_types[static_cast<size_t>(i)];
    if (type != "full_attention" && type != "sliding_attention")
      throw Error(ErrorKind::Unsupported,
                  c.dir + "/config.json: layer type '" + type + "' is not supported by " + c.model_type);
    AttentionSpec a;
    a.hidden = c.hidden_size;
    a.heads = c.num_heads;
    a.kv_heads = c.num_kv_heads;
    a.head_dim = c.head_dim;
    a.qkv_bias = spec.qkv_bias;
    a.qk_norm = spec.qk_norm;
    a.norm_plus_one = spec.norm_plus_one;
    a.norm_eps = eps;
    a.scale = spec.attn_scale > 0 ? spec.attn_scale : 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    a.softcap = spec.attn_softcap;
    a.window = c.is_sliding(i) ? c.sliding_window : 0;
    if (c.is_sliding(i) && c.sliding_window <= 0)
      throw Error(ErrorKind::Corrupt, c.dir + "/config.json: sliding layers need a positive sliding_window");
    a.rope = make_rope(c.rope_for_layer(i), c.head_dim);
    a.f32_out = true;  // bf16 runs: the attention output joins the F32 residual without a bf16 rounding
    L.attn = Attention(b, p + ".self_attn", a);
    L.mlp = bind_gated_mlp(b, p + ".mlp", c.hidden_size, c.intermediate_size, spec.act, spec.mlp_bias);
    L.input_norm = {b.tensor(p + ".input_layernorm.weight", {c.hidden_size}), eps, spec.norm_plus_one};
    L.post_attn_norm = {b.tensor(p + ".post_attention_layernorm.weight", {c.hidden_size}), eps, spec.norm_plus_one};
    if (spec.sandwich_norms) {
      L.pre_ff_norm = {b.tensor(p + ".pre_feedforward_layernorm.weight", {c.hidden_size}), eps, spec.norm_plus_one};
      L.post_ff_norm = {b.tensor(p + ".post_feedforward_layernorm.weight", {c.hidden_size}), eps, spec.norm_plus_one};
    }
  }
  linear_sites_ = b.lora_sites();
  // Weights nobody asked for usually mean a config/checkpoint mismatch: say so, but keep going.
  std::vector<std::string> unused;
  for (const auto& n : ckpt_.names()) {
    if (b.used().count(n) || n.rfind("vision_tower.", 0) == 0 || n.rfind("multi_modal_projector.", 0) == 0 ||
        n.find("rotary_emb.inv_freq") != std::string::npos || (tied && n.rfind("lm_head.", 0) == 0))
      continue;
    unused.push_back(n);
  }
  if (!unused.empty())
    log::warn(c.dir + ": " + std::to_string(unused.size()) + " checkpoint tensors are not used by " + c.model_type +
              " (first: " + unused.front() + ")");
}

CacheList DecoderModel::make_cache(const CacheOptions& options) const {
  CacheList caches;
  for (int64_t i = 0; i < config_.num_layers; ++i)
    caches.push_back(make_attention_cache(config_.is_sliding(i) ? config_.sliding_window : 0, options));
  return caches;
}

Tensor DecoderModel::forward(const std::vector<int32_t>& ids, CacheList& caches, bool all_logits) {
  if (ids.empty()) throw Error(ErrorKind::InvalidArgument, "forward: no tokens");
  if (caches.size() != layers_.size())
    throw Error(ErrorKind::InvalidArgument, "forward: cache list does not match the model");
  // Decode: replayed from a captured graph where the device allows; with adapters, when the gathered kernels
  // serve them (the graph then reads that slot's device descriptors and holds the table they live in).
  if (ids.size() == 1 && !all_logits) {
    lora::GraphUse g = lora::graph_use();
    // Caches the single-step graph cannot replay in place (quantized K/V) may take a batch graph of one row.
    const bool in_place =
        std::all_of(caches.begin(), caches.end(), [](const auto& c) { return c->replay_buffer() != nullptr; });
    if (g.ok && !g.key && !in_place && batched_decode_enabled()) {
      const RowSpans s = single_row(ids, caches, false);
      if (BatchGraphs::eligible(s))
        return batch_graphs_.run(
            s, [this](const RowSpans& rows) { return forward_rows(rows); },
            [this](const CacheOptions& o) { return make_cache(o); });
    }
    if (g.ok)
      return step_graph_.run(
          ids[0], caches, [&] { return forward_tokens(ids, caches, false); }, g.key, std::move(g.hold));
  }
  return forward_tokens(ids, caches, all_logits);
}

bool DecoderModel::replays_decode(const Batch& batch) {
  return replays_decode(batch, layout_rows(batch, layers_.size()));
}

bool DecoderModel::replays_decode(const Batch& batch, const RowSpans& s) {
  if (batch.rows.size() < 2 || !batched_decode_enabled()) return false;  // one row takes the solo path
  for (const BatchRow& r : batch.rows)
    if (r.adapter_slot >= 0 || r.ids.size() != 1 || !r.want_logits) return false;
  const lora::GraphUse use = lora::graph_use();
  if (!use.ok || use.key) return false;
  return BatchGraphs::eligible(s) && batch_graphs_.replays(s);
}

Tensor DecoderModel::forward(const Batch& batch) {
  const lora::BatchScope adapters(batch);  // each row's adapter set, over the table the engine installed
  RowSpans s = layout_rows(batch, layers_.size());
  if (batch.device_ids) {  // the caller asked replays_decode() first
    LATHE_CHECK(replays_decode(batch, s), "forward: tokens on the device need a captured decode graph");
    return batch_graphs_.run(
        s, [this](const RowSpans& rows) { return forward_rows(rows); },
        [this](const CacheOptions& o) { return make_cache(o); });
  }
  // One sequence takes its own path (decode graphs on CUDA); its logits are those forward_rows would return.
  if (s.rows() == 1 && batch.rows[0].want_logits) return forward(batch.rows[0].ids, *batch.rows[0].caches, false);
  // Steps of decode rows on the base model replay from graphs per batch size (model/batch_graph.h).
  const bool base =
      std::all_of(batch.rows.begin(), batch.rows.end(), [](const BatchRow& r) { return r.adapter_slot < 0; });
  bool graphs = base && batched_decode_enabled() && BatchGraphs::eligible(s);
  if (graphs) {
    const lora::GraphUse use = lora::graph_use();
    graphs = use.ok && !use.key;
  }
  if (graphs)
    return batch_graphs_.run(
        s, [this](const RowSpans& rows) { return forward_rows(rows); },
        [this](const CacheOptions& o) { return make_cache(o); });
  return forward_rows(s);
}

Tensor DecoderModel::forward_tokens(const std::vector<int32_t>& ids, CacheList& caches, bool all_logits) {
  return forward_rows(single_row(ids, caches, all_logits));
}

// The residual stream h stays F32. Norms whose output feeds a matmul emit the activation type (BF16 on
// CUDA); Gemma's post-norms, whose output is added to h, emit F32. All rows' tokens run through the norms and
// linears together; attention (RoPE, cache writes) runs per row inside Attention::forward_rows.
Tensor DecoderModel::forward_rows(const RowSpans& s) {
  const DType act = config_.load.dtype;
  auto norm = [](const RMSNorm& n, const Tensor& x, DType out) {
    return rms_norm(x, n.weight, n.eps, n.plus_one, out);
  };
  // Residual adds are fused with the RMSNorm that reads h next (one launch on CUDA): `pending` is a block's
  // output not yet added to h.
  auto add_norm = [](Tensor& h, const Tensor& b, const RMSNorm& n, DType out) {
    return add_rms_norm(h, b, n.weight, n.eps, n.plus_one, out);
  };
  Tensor h = embedding(s.ids, embed_);
  if (spec_.embed_scale != 1.0f) scale_inplace(h, spec_.embed_scale);
  Tensor pending;
  std::vector<LayerCache*> layer_caches(s.rows());
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& L = layers_[i];
    for (size_t r = 0; r < s.rows(); ++r) layer_caches[r] = (*s.caches[r])[i].get();
    const Tensor x = pending.defined() ? add_norm(h, pending, L.input_norm, act) : norm(L.input_norm, h, act);
    Tensor a = L.attn.forward_rows(x, s, layer_caches);
    if (spec_.sandwich_norms) {
      Tensor m = L.mlp(add_norm(h, norm(L.post_attn_norm, a, DType::F32), L.pre_ff_norm, act), /*f32_out=*/true);
      pending = norm(L.post_ff_norm, m, DType::F32);
    } else {
      pending = L.mlp(add_norm(h, a, L.post_attn_norm, act), /*f32_out=*/true);
    }
  }
  if (pending.defined()) add_inplace(h, pending);
  h = logit_inputs(h, s);
  if (!h.defined()) return Tensor();
  Tensor logits = linear(norm(final_norm_, h, act), lm_head_, nullptr, /*f32_out=*/true);
  if (spec_.final_softcap > 0) softcap_inplace(logits, spec_.final_softcap);
  return logits;
}

}  // namespace lathe
