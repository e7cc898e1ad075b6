// Shared by the CPU and CUDA LoRA gradient engines: family differences, weight binding, sequence checks.
#include "lab/train/lora_engine_arch.h"

#include <cmath>
#include <map>

#include "common/error.h"
#include "model/layers/rope.h"
#include "model/weights.h"

namespace lathe::train {
namespace {

ag::Gate gate_of(const std::string& name) {
  if (name == "silu" || name == "swish") return ag::Gate::SiLU;
  if (name == "gelu_pytorch_tanh" || name == "gelu_tanh" || name == "gelu_new" || name == "gelu_approx")
    return ag::Gate::GeluTanh;
  throw Error(ErrorKind::Unsupported, "activation '" + name + "' is not supported for training");
}

}  // namespace

const char* const kSiteNames[kSites] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                        "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};

ArchSpec arch_spec(const ModelConfig& c) {
  ArchSpec s;
  const std::string& t = c.model_type;
  if (t == "llama" || t == "mistral") {
    s.qkv_bias = c.get_bool("attention_bias", false);
    s.mlp_bias = c.get_bool("mlp_bias", false);
    s.act = gate_of(c.hidden_act);
  } else if (t == "qwen2") {
    s.qkv_bias = true;
    s.act = gate_of(c.hidden_act);
  } else if (t == "qwen3") {
    s.qk_norm = true;
    s.qkv_bias = c.get_bool("attention_bias", false);
    s.act = gate_of(c.hidden_act);
  } else if (t == "gemma3" || t == "gemma3_text") {
    s.norm_plus_one = s.sandwich = s.qk_norm = true;
    s.act = gate_of(c.get_string("hidden_activation", "gelu_pytorch_tanh"));
    s.embed_scale = std::sqrt(static_cast<float>(c.hidden_size));
    s.attn_scale =
        1.0f / std::sqrt(static_cast<float>(c.get_double("query_pre_attn_scalar", static_cast<double>(c.head_dim))));
    s.attn_softcap = static_cast<float>(c.get_double("attn_logit_softcapping", 0.0));
    s.final_softcap = static_cast<float>(c.get_double("final_logit_softcapping", 0.0));
  } else {
    throw Error(ErrorKind::Unsupported,
                "LoRA training does not support model_type '" + t + "' yet (llama, mistral, qwen2, qwen3, gemma3)");
  }
  return s;
}

float attention_scale(const ModelConfig& c, const ArchSpec& spec) {
  return spec.attn_scale > 0 ? spec.attn_scale : 1.0f / std::sqrt(static_cast<float>(c.head_dim));
}

BoundDecoder bind_decoder(const Model& model, const ModelConfig& c, const ArchSpec& spec, LoraParams& params) {
  BoundDecoder d;
  WeightBinder b(model.checkpoint(), c);
  const int64_t H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  d.embed = b.embedding("model.embed_tokens", c.vocab_size, H);
  const bool tied = c.tie_word_embeddings || !b.has("lm_head.weight");
  d.head = tied ? d.embed : b.linear("lm_head", c.vocab_size, H);
  d.final_norm = b.tensor("model.norm.weight", {H});
  std::map<std::string, LoraParam*> by_module;
  for (LoraParam& p : params.params) {
    if (p.a.dtype() != DType::F32 || p.b.dtype() != DType::F32 || !p.a.is_contiguous() || !p.b.is_contiguous() ||
        p.a.ndim() != 2 || p.b.ndim() != 2 || p.grad_a.shape() != p.a.shape() || p.grad_b.shape() != p.b.shape() ||
        p.grad_a.dtype() != DType::F32 || p.grad_b.dtype() != DType::F32)
      throw Error(ErrorKind::InvalidArgument, "LoRA param " + p.module + ": a/b and their grads must be F32 2-D");
    if (!by_module.emplace(p.module, &p).second)
      throw Error(ErrorKind::InvalidArgument, "LoRA param " + p.module + " is given twice");
  }
  d.layers.resize(static_cast<size_t>(c.num_layers));
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i);
    LayerWeights& L = d.layers[static_cast<size_t>(i)];
    const std::string& type = c.layer_types[static_cast<size_t>(i)];
    if (type != "full_attention" && type != "sliding_attention")
      throw Error(ErrorKind::Unsupported, "LoRA training: layer type '" + type + "' is not supported");
    const int64_t qo = c.num_heads * D, kvo = c.num_kv_heads * D;
    const int64_t outs[kSites] = {qo, kvo, kvo, H, I, I, H}, ins[kSites] = {H, H, H, qo, H, H, I};
    for (int s = 0; s < kSites; ++s) {
      const std::string m = p + "." + kSiteNames[s];
      L.w[s] = b.linear(m, outs[s], ins[s]);
      const bool biased = s <= kV ? spec.qkv_bias : (s >= kGate && spec.mlp_bias);
      if (biased) L.bias[s] = b.tensor(m + ".bias", {outs[s]});
      if (auto it = by_module.find(m); it != by_module.end()) {
        LoraParam* lp = it->second;
        if (lp->a.dim(1) != ins[s] || lp->b.dim(0) != outs[s] || lp->b.dim(1) != lp->a.dim(0))
          throw Error(ErrorKind::InvalidArgument, "LoRA param " + m + " has a " + shape_str(lp->a.shape()) + ", b " +
                                                      shape_str(lp->b.shape()) + "; the layer is [" +
                                                      std::to_string(outs[s]) + ", " + std::to_string(ins[s]) + "]");
        L.lora[s] = lp;
        by_module.erase(it);
      }
    }
    L.input_norm = b.tensor(p + ".input_layernorm.weight", {H});
    L.post_attn_norm = b.tensor(p + ".post_attention_layernorm.weight", {H});
    if (spec.sandwich) {
      L.pre_ff_norm = b.tensor(p + ".pre_feedforward_layernorm.weight", {H});
      L.post_ff_norm = b.tensor(p + ".post_feedforward_layernorm.weight", {H});
    }
    if (spec.qk_norm) {
      L.q_norm = b.tensor(p + ".self_attn.q_norm.weight", {D});
      L.k_norm = b.tensor(p + ".self_attn.k_norm.weight", {D});
    }
    L.rope = make_rope(c.rope_for_layer(i), D);
    L.window = c.is_sliding(i) ? c.sliding_window : 0;
    if (c.is_sliding(i) && c.sliding_window <= 0)
      throw Error(ErrorKind::Corrupt, c.dir + "/config.json: sliding layers need a positive sliding_window");
  }
  if (!by_module.empty())
    throw Error(ErrorKind::InvalidArgument,
                "LoRA param " + by_module.begin()->first + " names no trainable linear of this model");
  return d;
}

SequencePlan plan_sequence(const TrainSequence& seq, size_t index, int64_t vocab_size) {
  const std::string which = "sequence " + std::to_string(index);
  if (seq.ids.empty()) throw Error(ErrorKind::InvalidArgument, which + " is empty");
  if (seq.target.size() != seq.ids.size())
    throw Error(ErrorKind::InvalidArgument, which + ": target mask length differs from its ids");
  if (seq.target[0]) throw Error(ErrorKind::InvalidArgument, which + ": position 0 cannot be a target");
  SequencePlan st;
  st.ids = seq.ids;
  const int64_t T = static_cast<int64_t>(seq.ids.size());
  for (int32_t id : seq.ids)
    if (id < 0 || id >= vocab_size)
      throw Error(ErrorKind::InvalidArgument, which + ": token id " + std::to_string(id) +
                                                  " is outside the vocabulary of " + std::to_string(vocab_size));
  // Row r predicts token r + 1 when that token is a target.
  st.targets.assign(static_cast<size_t>(T), -1);
  for (int64_t j = 1; j < T; ++j)
    if (seq.target[static_cast<size_t>(j)]) {
      st.targets[static_cast<size_t>(j - 1)] = seq.ids[static_cast<size_t>(j)];
      ++st.n_targets;
    }
  if (seq.segments.empty()) {
    for (int64_t r = 0; r < T; ++r) st.positions.push_back(r);
    return st;
  }
  // A packed row: positions restart and attention stays inside each example; no example predicts the next one's
  // first token.
  int64_t start = 0;
  for (int64_t len : seq.segments) {
    if (len <= 0 || len > T - start)
      throw Error(ErrorKind::InvalidArgument,
                  which + ": packed segment lengths must be positive and sum to " + std::to_string(T));
    if (seq.target[static_cast<size_t>(start)])
      throw Error(ErrorKind::InvalidArgument, which + ": the first token of a packed example cannot be a target");
    for (int64_t r = 0; r < len; ++r) st.positions.push_back(r), st.seg_start.push_back(start);
    start += len;
  }
  if (start != T)
    throw Error(ErrorKind::InvalidArgument,
                which + ": packed segment lengths must be positive and sum to " + std::to_string(T));
  return st;
}

}  // namespace lathe::train
