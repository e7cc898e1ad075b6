// Precision on CUDA (bf16 runs): the residual stream h stays F32; norms that feed a matmul emit the activation
// type, norms whose output is added to h emit F32 (as in decoder.cc). On the CPU everything is F32.
// Gemma 4 (text): sandwich-normed blocks (plain-weight RMSNorm) over sliding layers (default rope, head_dim)
// and global layers (proportional partial rope, their own head_dim and KV heads from per_layer_config or the
// legacy global_head_dim / num_global_key_value_heads); q/k norms and a weightless v norm with attention scale
// 1; attention_k_eq_v (V = K projection) on global layers; per-layer input embeddings (PLE); an optional MoE
// block beside the dense MLP; layer_scalar on each layer's output; the last num_kv_shared_layers layers reuse
// the K/V of the last earlier layer of their type (caches exist for donors only); tied head with a final
// logit softcap.
#include <cmath>

#include "common/error.h"
#include "model/arch/archs.h"
#include "model/layers/attention.h"
#include "model/layers/moe.h"
#include "model/layers/rope.h"
#include "tensor/ops_extra.h"

namespace lathe::arch {
namespace {

class Gemma4Model : public Model {
 public:
  Gemma4Model(ModelConfig c, Checkpoint ckpt);
  CacheList make_cache(const CacheOptions& options) const override;
  Tensor forward(const std::vector<int32_t>& ids, CacheList& caches, bool all_logits) override;
  Tensor forward(const Batch& batch) override;

 private:
  struct Layer {
    RMSNorm input_norm, post_attn_norm, pre_ff_norm, post_ff_norm;
    Attention attn;
    GatedMLP mlp;
    float scalar = 1.0f;
    int64_t kv_donor = -1;  // KV-shared layers: the layer whose K/V they read
    // Per-layer input (PLE).
    Linear ple_gate, ple_proj;
    RMSNorm ple_post_norm;
    // MoE block beside the dense MLP.
    bool moe = false;
    Router router;
    Experts experts;
    RMSNorm post_ff_norm_1, pre_ff_norm_2, post_ff_norm_2;
  };
  Tensor per_layer_inputs(const std::vector<int32_t>& ids, const Tensor& h) const;
  // views[layer][row]: the K/V each donor layer attended over, for the KV-shared layers after it.
  void run_layer(size_t i, Tensor& h, const Tensor& ple, const RowSpans& s,
                 std::vector<std::vector<KVView>>& views) const;
  Tensor forward_rows(const RowSpans& s) const;

  Weight embed_;
  float embed_scale_ = 1.0f;
  int64_t ple_dim_ = 0;
  Weight embed_per_layer_;
  Linear ple_model_proj_;
  RMSNorm ple_proj_norm_;
  std::vector<Layer> layers_;
  int64_t donors_ = 0;  // layers [0, donors_) own caches
  RMSNorm final_norm_;
  float final_softcap_ = 0.0f;
  Activation act_ = Activation::GeluTanh;
};

// A per-layer override (transformers ≥ 5.15 `per_layer_config`), else the fallback.
int64_t layer_override(const ModelConfig& c, int64_t layer, const char* key, int64_t fallback) {
  if (!c.has("per_layer_config")) return fallback;
  const auto& plc = c.text["per_layer_config"];
  const std::string idx = std::to_string(layer);
  if (!plc.is_object() || !plc.contains(idx) || !plc[idx].is_object() || !plc[idx].contains(key)) return fallback;
  const auto& v = plc[idx][key];
  if (!v.is_number_integer())
    throw Error(ErrorKind::Corrupt,
                c.dir + "/config.json: per_layer_config['" + idx + "']." + key + " must be an integer");
  return v.get<int64_t>();
}

Gemma4Model::Gemma4Model(ModelConfig config, Checkpoint ckpt) : Model(std::move(config), std::move(ckpt)) {
  const ModelConfig& c = config_;
  WeightBinder b(ckpt_, c);
  const float eps = static_cast<float>(c.rms_norm_eps);
  const int64_t L = c.num_layers, H = c.hidden_size;
  act_ = parse_activation(c.hidden_act);
  embed_ = b.embedding("model.embed_tokens", c.vocab_size, H);
  embed_scale_ = std::sqrt(static_cast<float>(H));
  final_norm_ = {b.tensor("model.norm.weight", {H}), eps, false};
  final_softcap_ = static_cast<float>(c.get_double("final_logit_softcapping", 0.0));

  ple_dim_ = c.get_int("hidden_size_per_layer_input", 0);
  if (ple_dim_ > 0) {
    embed_per_layer_ = b.embedding("model.embed_tokens_per_layer",
                                   c.get_int("vocab_size_per_layer_input", c.vocab_size), L * ple_dim_);
    ple_model_proj_ = bind_linear(b, "model.per_layer_model_projection", L * ple_dim_, H);
    ple_proj_norm_ = {b.tensor("model.per_layer_projection_norm.weight", {ple_dim_}), eps, false};
  }

  const int64_t shared = c.get_int("num_kv_shared_layers", 0);
  donors_ = L - shared;
  if (shared < 0 || donors_ <= 0)
    throw Error(ErrorKind::Corrupt, c.dir + "/config.json: num_kv_shared_layers " + std::to_string(shared) +
                                        " leaves no layer with its own K/V");
  const bool k_eq_v = c.get_bool("attention_k_eq_v", false);
  const bool moe = c.get_bool("enable_moe_block", false);
  const bool double_wide = c.get_bool("use_double_wide_mlp", false);
  const int64_t global_head_dim = c.get_int("global_head_dim", 0);
  const int64_t global_kv_heads = c.get_int("num_global_key_value_heads", 0);

  layers_.resize(static_cast<size_t>(L));
  for (int64_t i = 0; i < L; ++i) {
    const std::string p = "model.layers." + std::to_string(i);
    Layer& Ly = layers_[static_cast<size_t>(i)];
    const std::string& type = c.layer_types[static_cast<size_t>(i)];
    if (type != "full_attention" && type != "sliding_attention")
      throw Error(ErrorKind::Unsupported, c.dir + "/config.json: layer type '" + type + "' is not supported by gemma4");
    const bool full = type == "full_attention";
    const bool is_shared = i >= donors_;
    if (is_shared) {
      for (int64_t j = donors_ - 1; j >= 0 && Ly.kv_donor < 0; --j)
        if (c.layer_types[static_cast<size_t>(j)] == type) Ly.kv_donor = j;
      if (Ly.kv_donor < 0)
        throw Error(ErrorKind::Corrupt, c.dir + "/config.json: KV-shared layer " + std::to_string(i) +
                                            " has no earlier " + type + " layer to read K/V from");
    }
    AttentionSpec a;
    a.hidden = H;
    a.heads = layer_override(c, i, "num_attention_heads", c.num_heads);
    a.head_dim = layer_override(c, i, "head_dim", full && global_head_dim > 0 ? global_head_dim : c.head_dim);
    a.k_eq_v = k_eq_v && full;
    a.kv_heads =
        layer_override(c, i, "num_key_value_heads", a.k_eq_v && global_kv_heads > 0 ? global_kv_heads : c.num_kv_heads);
    a.qkv_bias = a.o_bias = c.get_bool("attention_bias", false);
    a.qk_norm = true;
    a.v_norm = true;
    a.kv_shared = is_shared;
    a.norm_eps = eps;
    a.scale = 1.0f;  // q and k are normed instead
    a.window = full ? 0 : c.sliding_window;
    if (!full && c.sliding_window <= 0)
      throw Error(ErrorKind::Corrupt, c.dir + "/config.json: sliding layers need a positive sliding_window");
    a.rope = make_rope(c.rope_for_layer(i), a.head_dim);
    a.f32_out = true;
    Ly.attn = Attention(b, p + ".self_attn", a);
    const int64_t inter = c.intermediate_size * (double_wide && is_shared ? 2 : 1);
    Ly.mlp = bind_gated_mlp(b, p + ".mlp", H, inter, act_);
    Ly.input_norm = {b.tensor(p + ".input_layernorm.weight", {H}), eps, false};
    Ly.post_attn_norm = {b.tensor(p + ".post_attention_layernorm.weight", {H}), eps, false};
    Ly.pre_ff_norm = {b.tensor(p + ".pre_feedforward_layernorm.weight", {H}), eps, false};
    Ly.post_ff_norm = {b.tensor(p + ".post_feedforward_layernorm.weight", {H}), eps, false};
    if (b.has(p + ".layer_scalar")) Ly.scalar = b.tensor(p + ".layer_scalar", {1}).to_floats()[0];
    if (ple_dim_ > 0) {
      Ly.ple_gate = bind_linear(b, p + ".per_layer_input_gate", ple_dim_, H);
      Ly.ple_proj = bind_linear(b, p + ".per_layer_projection", H, ple_dim_);
      Ly.ple_post_norm = {b.tensor(p + ".post_per_layer_input_norm.weight", {H}), eps, false};
    }
    if (moe) {
      const int64_t E = c.get_int("num_experts", 0), K = c.get_int("top_k_experts", 0);
      Ly.moe = true;
      Ly.router = bind_router(b, p + ".router", H, E, K, eps);
      Ly.experts = bind_experts(b, p + ".experts", E, H, c.get_int("moe_intermediate_size", 0), act_);
      Ly.post_ff_norm_1 = {b.tensor(p + ".post_feedforward_layernorm_1.weight", {H}), eps, false};
      Ly.pre_ff_norm_2 = {b.tensor(p + ".pre_feedforward_layernorm_2.weight", {H}), eps, false};
      Ly.post_ff_norm_2 = {b.tensor(p + ".post_feedforward_layernorm_2.weight", {H}), eps, false};
    }
  }
}

CacheList Gemma4Model::make_cache(const CacheOptions& options) const {
  CacheList caches;
  for (int64_t i = 0; i < donors_; ++i)
    caches.push_back(make_attention_cache(layers_[static_cast<size_t>(i)].attn.spec().window, options));
  return caches;
}

// PLE: token-identity rows of embed_tokens_per_layer (× √W) plus a projection of the scaled embeddings
// (× hidden^-½, RMSNorm per layer slice), averaged by × 2^-½. Returns [T, L, W].
// The result is in the activation type and laid out [L, T, W], so each layer's slice is contiguous.
Tensor Gemma4Model::per_layer_inputs(const std::vector<int32_t>& ids, const Tensor& h) const {
  const int64_t T = h.dim(0), L = static_cast<int64_t>(layers_.size());
  const DType act = config_.load.dtype;
  Tensor proj = linear(convert(h, act), ple_model_proj_.w, nullptr, /*f32_out=*/true);
  scale_inplace(proj, 1.0f / std::sqrt(static_cast<float>(config_.hidden_size)));
  proj = ple_proj_norm_(proj.reshape({T, L, ple_dim_}));
  Tensor tok = embedding(ids, embed_per_layer_);
  scale_inplace(tok, std::sqrt(static_cast<float>(ple_dim_)));
  add_inplace(proj, tok.reshape({T, L, ple_dim_}));
  scale_inplace(proj, 1.0f / std::sqrt(2.0f));
  return convert(proj, act).transpose(0, 1).contiguous();
}

void Gemma4Model::run_layer(size_t i, Tensor& h, const Tensor& ple, const RowSpans& s,
                            std::vector<std::vector<KVView>>& views) const {
  const Layer& Ly = layers_[i];
  const DType act = config_.load.dtype;
  auto to_act = [act](const RMSNorm& n, const Tensor& x) { return rms_norm(x, n.weight, n.eps, n.plus_one, act); };
  auto to_f32 = [](const RMSNorm& n, const Tensor& x) { return rms_norm(x, n.weight, n.eps, n.plus_one, DType::F32); };
  const Tensor x = to_act(Ly.input_norm, h);
  Tensor a;
  if (Ly.kv_donor >= 0) {
    a = Ly.attn.forward_shared_rows(x, s, views[static_cast<size_t>(Ly.kv_donor)]);
  } else {
    std::vector<LayerCache*> caches(s.rows());
    for (size_t r = 0; r < s.rows(); ++r) caches[r] = (*s.caches[r])[i].get();
    a = Ly.attn.forward_rows(x, s, caches, &views[i]);
  }
  add_inplace(h, to_f32(Ly.post_attn_norm, a));

  Tensor m = Ly.mlp(to_act(Ly.pre_ff_norm, h), /*f32_out=*/true);
  if (Ly.moe) {  // the experts and the router read the post-attention residual, not the MLP's input norm
    m = to_f32(Ly.post_ff_norm_1, m);
    std::vector<int32_t> idx;
    std::vector<float> w;
    Ly.router.route(h, act, idx, w);
    add_inplace(m, to_f32(Ly.post_ff_norm_2, Ly.experts(to_act(Ly.pre_ff_norm_2, h), idx, w, Ly.router.top_k)));
  }
  add_inplace(h, to_f32(Ly.post_ff_norm, m));

  if (ple_dim_ > 0) {
    const Tensor g = gelu_tanh_mul(Ly.ple_gate(convert(h, act)), ple.select(0, static_cast<int64_t>(i)));
    add_inplace(h, to_f32(Ly.ple_post_norm, Ly.ple_proj(g)));
  }
  if (Ly.scalar != 1.0f) scale_inplace(h, Ly.scalar);
}

Tensor Gemma4Model::forward(const std::vector<int32_t>& ids, CacheList& caches, bool all_logits) {
  if (ids.empty()) throw Error(ErrorKind::InvalidArgument, "forward: no tokens");
  if (static_cast<int64_t>(caches.size()) != donors_)
    throw Error(ErrorKind::InvalidArgument, "forward: cache list does not match the model (" +
                                                std::to_string(caches.size()) + " caches for " +
                                                std::to_string(donors_) + " KV layers)");
  return forward_rows(single_row(ids, caches, all_logits));
}

Tensor Gemma4Model::forward(const Batch& batch) {
  return forward_rows(layout_rows(batch, static_cast<size_t>(donors_)));
}

// All rows' tokens share the embeddings, PLE, norms, linears and experts; attention runs per row.
Tensor Gemma4Model::forward_rows(const RowSpans& s) const {
  Tensor h = embedding(s.ids, embed_);
  scale_inplace(h, embed_scale_);
  const Tensor ple = ple_dim_ > 0 ? per_layer_inputs(s.ids, h) : Tensor();
  std::vector<std::vector<KVView>> views(layers_.size());
  for (size_t i = 0; i < layers_.size(); ++i) run_layer(i, h, ple, s, views);
  h = logit_inputs(h, s);
  if (!h.defined()) return Tensor();
  const Tensor x = rms_norm(h, final_norm_.weight, final_norm_.eps, final_norm_.plus_one, config_.load.dtype);
  Tensor logits = linear(x, embed_, nullptr, /*f32_out=*/true);
  if (final_softcap_ > 0) softcap_inplace(logits, final_softcap_);
  return logits;
}

}  // namespace

std::unique_ptr<Model> build_gemma4(ModelConfig c, Checkpoint ckpt) {
  if (!c.rope.count("sliding_attention")) {  // configs without per-type rope parameters: Gemma 4's defaults
    RopeParams local;
    local.theta = 10000.0;
    c.rope["sliding_attention"] = local;
  }
  return std::make_unique<Gemma4Model>(std::move(c), std::move(ckpt));
}

}  // namespace lathe::arch
