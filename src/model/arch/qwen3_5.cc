// Qwen3.5 (text, dense): pre-norm blocks with SwiGLU MLPs where layer_types mixes Gated DeltaNet
// ("linear_attention", SSMCache) and gated full attention (q_proj carries query and an output gate, per-head
// q/k RMSNorm, partial rope, scale head_dim^-½, KV cache). RMSNorm weights are zero-centred (1 + w) in HF
// checkpoints; MLX-converted ones (conv1d stored [C, K, 1]) have the 1 folded in already.
// Config keys: layer_types (or full_attention_interval), linear_num_{key,value}_heads,
// linear_{key,value}_head_dim, linear_conv_kernel_dim, head_dim, rope_parameters{rope_theta,
// partial_rotary_factor}, tie_word_embeddings.
#include <cmath>

#include "common/error.h"
#include "model/arch/archs.h"
#include "model/layers/attention.h"
#include "model/layers/gated_delta.h"
#include "model/layers/rope.h"

namespace lathe::arch {
namespace {

class Qwen35Model : public Model {
 public:
  Qwen35Model(ModelConfig c, Checkpoint ckpt);
  CacheList make_cache(const CacheOptions& options) const override;
  Tensor forward(const std::vector<int32_t>& ids, CacheList& caches, bool all_logits) override;
  Tensor forward(const Batch& batch) override;

 private:
  Tensor forward_rows(const RowSpans& s) const;
  struct Layer {
    bool linear = false;
    GatedDeltaNet delta;
    Attention attn;
    GatedMLP mlp;
    RMSNorm input_norm, post_attn_norm;
  };
  Weight embed_, lm_head_;
  std::vector<Layer> layers_;
  RMSNorm final_norm_;
};

Qwen35Model::Qwen35Model(ModelConfig config, Checkpoint ckpt) : Model(std::move(config), std::move(ckpt)) {
  const ModelConfig& c = config_;
  WeightBinder b(ckpt_, c);
  const float eps = static_cast<float>(c.rms_norm_eps);
  const int64_t H = c.hidden_size;
  embed_ = b.embedding("model.embed_tokens", c.vocab_size, H);
  const bool tied = c.tie_word_embeddings || !b.has("lm_head.weight");
  lm_head_ = tied ? embed_ : b.linear("lm_head", c.vocab_size, H);

  GatedDeltaSpec ds;
  ds.hidden = H;
  ds.k_heads = c.get_int("linear_num_key_heads", 16);
  ds.v_heads = c.get_int("linear_num_value_heads", 32);
  ds.k_dim = c.get_int("linear_key_head_dim", 128);
  ds.v_dim = c.get_int("linear_value_head_dim", 128);
  ds.conv_kernel = c.get_int("linear_conv_kernel_dim", 4);
  ds.norm_eps = eps;

  // Bind the linear layers first: their conv layout says whether norm weights are zero-centred.
  layers_.resize(static_cast<size_t>(c.num_layers));
  bool plus_one = true;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string& type = c.layer_types[static_cast<size_t>(i)];
    if (type != "linear_attention" && type != "full_attention")
      throw Error(ErrorKind::Unsupported,
                  c.dir + "/config.json: layer type '" + type + "' is not supported by qwen3_5");
    Layer& L = layers_[static_cast<size_t>(i)];
    L.linear = type == "linear_attention";
    if (L.linear) {
      L.delta = GatedDeltaNet(b, "model.layers." + std::to_string(i) + ".linear_attn", ds);
      plus_one = L.delta.hf_layout();
    }
  }
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i);
    Layer& L = layers_[static_cast<size_t>(i)];
    if (!L.linear) {
      AttentionSpec a;
      a.hidden = H;
      a.heads = c.num_heads;
      a.kv_heads = c.num_kv_heads;
      a.head_dim = c.head_dim;
      a.qkv_bias = a.o_bias = c.get_bool("attention_bias", false);
      a.qk_norm = true;
      a.norm_plus_one = plus_one;
      a.q_gate = true;
      a.norm_eps = eps;
      a.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
      a.rope = make_rope(c.rope_for_layer(i), c.head_dim);
      a.f32_out = true;
      L.attn = Attention(b, p + ".self_attn", a);
    }
    L.mlp = bind_gated_mlp(b, p + ".mlp", H, c.intermediate_size, parse_activation(c.hidden_act));
    L.input_norm = {b.tensor(p + ".input_layernorm.weight", {H}), eps, plus_one};
    L.post_attn_norm = {b.tensor(p + ".post_attention_layernorm.weight", {H}), eps, plus_one};
  }
  final_norm_ = {b.tensor("model.norm.weight", {H}), eps, plus_one};
}

CacheList Qwen35Model::make_cache(const CacheOptions& options) const {
  CacheList caches;
  for (const Layer& L : layers_) {
    if (L.linear)
      caches.push_back(std::make_unique<SSMCache>());
    else
      caches.push_back(make_attention_cache(0, options));
  }
  return caches;
}

Tensor Qwen35Model::forward(const std::vector<int32_t>& ids, CacheList& caches, bool all_logits) {
  if (ids.empty()) throw Error(ErrorKind::InvalidArgument, "forward: no tokens");
  if (caches.size() != layers_.size())
    throw Error(ErrorKind::InvalidArgument, "forward: cache list does not match the model");
  return forward_rows(single_row(ids, caches, all_logits));
}

Tensor Qwen35Model::forward(const Batch& batch) { return forward_rows(layout_rows(batch, layers_.size())); }

// All rows' tokens share the norms, projections and MLPs; each row's SSM state and KV cache advance on its own.
Tensor Qwen35Model::forward_rows(const RowSpans& s) const {
  // The residual stream h stays F32; norms feeding a matmul emit the activation type (BF16 in CUDA bf16 runs).
  const DType act = config_.load.dtype;
  auto norm = [act](const RMSNorm& n, const Tensor& x) { return rms_norm(x, n.weight, n.eps, n.plus_one, act); };
  Tensor h = embedding(s.ids, embed_);
  std::vector<LayerCache*> caches(s.rows());
  std::vector<SSMCache*> states(s.rows());
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& L = layers_[i];
    const Tensor x = norm(L.input_norm, h);
    Tensor a;
    if (L.linear) {
      for (size_t r = 0; r < s.rows(); ++r) {
        states[r] = dynamic_cast<SSMCache*>((*s.caches[r])[i].get());
        if (!states[r])
          throw Error(ErrorKind::InvalidArgument, "forward: layer " + std::to_string(i) + " needs an ssm cache");
      }
      a = L.delta.forward_rows(x, s, states);
    } else {
      for (size_t r = 0; r < s.rows(); ++r) caches[r] = (*s.caches[r])[i].get();
      a = L.attn.forward_rows(x, s, caches);
    }
    add_inplace(h, a);
    add_inplace(h, L.mlp(norm(L.post_attn_norm, h), /*f32_out=*/true));
  }
  h = logit_inputs(h, s);
  if (!h.defined()) return Tensor();
  return linear(norm(final_norm_, h), lm_head_, nullptr, /*f32_out=*/true);
}

}  // namespace

std::unique_ptr<Model> build_qwen3_5(ModelConfig c, Checkpoint ckpt) {
  return std::make_unique<Qwen35Model>(std::move(c), std::move(ckpt));
}

}  // namespace lathe::arch
