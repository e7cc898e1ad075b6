// CPU f32 LoRA gradient engine: DecoderModel's forward on the autograd tape with per-layer checkpointing.
#include "lab/train/lora_engine_cpu.h"

#include <cmath>
#include <map>

#include "common/error.h"
#include "lab/train/autograd.h"
#include "lab/train/lora_dropout.h"
#include "model/layers/rope.h"
#include "model/weights.h"

namespace lathe::train {
namespace {

// What differs between the dense decoders (as the arch/*.cc builders fill DecoderSpec).
struct ArchSpec {
  bool norm_plus_one = false, sandwich = false, qk_norm = false, qkv_bias = false, mlp_bias = false;
  ag::Gate act = ag::Gate::SiLU;
  float embed_scale = 1.0f, attn_scale = 0.0f, attn_softcap = 0.0f, final_softcap = 0.0f;
};

ag::Gate gate_of(const std::string& name) {
  if (name == "silu" || name == "swish") return ag::Gate::SiLU;
  if (name == "gelu_pytorch_tanh" || name == "gelu_tanh" || name == "gelu_new" || name == "gelu_approx")
    return ag::Gate::GeluTanh;
  throw Error(ErrorKind::Unsupported, "activation '" + name + "' is not supported for training");
}

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

// The seven LoRA targets of a layer, in a fixed order.
enum Site { kQ, kK, kV, kO, kGate, kUp, kDown, kSites };
const char* const kSiteNames[kSites] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                        "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};

struct LayerWeights {
  Tensor input_norm, post_attn_norm, pre_ff_norm, post_ff_norm, q_norm, k_norm;
  Weight w[kSites];
  Tensor bias[kSites];
  LoraParam* lora[kSites] = {};
  RopeTable rope;
  int64_t window = 0;
};

// One sequence between forward and backward: its ids, per-position targets (the next token or -1), each
// layer's input residual and the final residual.
struct SeqState {
  std::vector<int32_t> ids;
  std::vector<int32_t> targets;
  std::vector<int64_t> positions;  // restart at 0 per packed example
  std::vector<int64_t> seg_start;  // per row: the first row of its example (empty: one example)
  std::vector<ag::Var> layer_in;   // [layers + 1]: the last one is the final norm's input
};

class CpuEngine : public LoraGradientEngine {
 public:
  CpuEngine(const Model& model, LoraParams& params);
  SequenceLogProbs forward(const std::vector<TrainSequence>& batch, bool with_adapter) override;
  void backward(const std::vector<double>& weight_per_sequence) override;
  void dropout_next(const LoraDropout& d) override { pending_drop_ = d; }

 private:
  // Which LoRA branch a proj is: for its dropout mask (nullptr drop: the adapter without dropout).
  struct Branch {
    const LoraDropout* drop = nullptr;
    int64_t seq = 0, layer = 0;
  };
  ag::Var layer_forward(ag::Tape& t, size_t l, const ag::Var& h, const SeqState& st, bool adapter,
                        const LoraDropout* drop, int64_t seq);
  ag::Var proj(ag::Tape& t, const LayerWeights& L, Site s, const ag::Var& x, bool adapter, const Branch& br);
  ag::Var head_logprobs(ag::Tape& t, const ag::Var& h, const std::vector<int32_t>& targets);

  const Model& model_;
  ModelConfig cfg_;  // the model's, with exact (unpacked) CPU weights for the binder
  ArchSpec spec_;
  LoraParams& params_;
  Weight embed_, head_;
  Tensor final_norm_;
  std::vector<LayerWeights> layers_;
  float eps_ = 1e-6f;
  std::vector<SeqState> saved_;  // from the last forward(with_adapter=true)
  LoraDropout pending_drop_;     // for the next forward(with_adapter=true)
  LoraDropout saved_drop_;       // the one saved_ was computed with (backward's recompute replays its masks)
};

CpuEngine::CpuEngine(const Model& model, LoraParams& params)
    : model_(model), cfg_(model.config()), spec_(arch_spec(cfg_)), params_(params) {
  if (cfg_.load.device != Device::CPU)
    throw Error(ErrorKind::Unsupported, "the CPU LoRA gradient engine needs a model loaded on the CPU");
  cfg_.load.exact = true;
  const ModelConfig& c = cfg_;
  eps_ = static_cast<float>(c.rms_norm_eps);
  WeightBinder b(model_.checkpoint(), cfg_);
  const int64_t H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  embed_ = b.embedding("model.embed_tokens", c.vocab_size, H);
  const bool tied = c.tie_word_embeddings || !b.has("lm_head.weight");
  head_ = tied ? embed_ : b.linear("lm_head", c.vocab_size, H);
  final_norm_ = b.tensor("model.norm.weight", {H});
  std::map<std::string, LoraParam*> by_module;
  for (LoraParam& p : params_.params) {
    if (p.a.dtype() != DType::F32 || p.b.dtype() != DType::F32 || !p.a.is_contiguous() || !p.b.is_contiguous() ||
        p.a.ndim() != 2 || p.b.ndim() != 2 || p.grad_a.shape() != p.a.shape() || p.grad_b.shape() != p.b.shape() ||
        p.grad_a.dtype() != DType::F32 || p.grad_b.dtype() != DType::F32)
      throw Error(ErrorKind::InvalidArgument, "LoRA param " + p.module + ": a/b and their grads must be F32 2-D");
    if (!by_module.emplace(p.module, &p).second)
      throw Error(ErrorKind::InvalidArgument, "LoRA param " + p.module + " is given twice");
  }
  layers_.resize(static_cast<size_t>(c.num_layers));
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i);
    LayerWeights& L = layers_[static_cast<size_t>(i)];
    const std::string& type = c.layer_types[static_cast<size_t>(i)];
    if (type != "full_attention" && type != "sliding_attention")
      throw Error(ErrorKind::Unsupported, "LoRA training: layer type '" + type + "' is not supported");
    const int64_t qo = c.num_heads * D, kvo = c.num_kv_heads * D;
    const int64_t outs[kSites] = {qo, kvo, kvo, H, I, I, H}, ins[kSites] = {H, H, H, qo, H, H, I};
    for (int s = 0; s < kSites; ++s) {
      const std::string m = p + "." + kSiteNames[s];
      L.w[s] = b.linear(m, outs[s], ins[s]);
      const bool biased = s <= kV ? spec_.qkv_bias : (s >= kGate && spec_.mlp_bias);
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
    if (spec_.sandwich) {
      L.pre_ff_norm = b.tensor(p + ".pre_feedforward_layernorm.weight", {H});
      L.post_ff_norm = b.tensor(p + ".post_feedforward_layernorm.weight", {H});
    }
    if (spec_.qk_norm) {
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
}

ag::Var CpuEngine::proj(ag::Tape& t, const LayerWeights& L, Site s, const ag::Var& x, bool adapter, const Branch& br) {
  ag::Var y = ag::linear(t, x, L.w[s], L.bias[s].defined() ? &L.bias[s] : nullptr);
  if (!adapter || !L.lora[s]) return y;
  ag::Var in = x;  // dropout on the LoRA input only; the base matmul above read x as it is
  if (br.drop && br.drop->p > 0)
    in = ag::masked(t, x, dropout_mask(dropout_stream(*br.drop, br.seq, br.layer, s), x->rows * x->cols, br.drop->p));
  return ag::add(t, y, ag::lora(t, in, *L.lora[s]));
}

// Mirrors DecoderModel::forward_rows for one layer of one sequence.
ag::Var CpuEngine::layer_forward(ag::Tape& t, size_t l, const ag::Var& h, const SeqState& st, bool adapter,
                                 const LoraDropout* drop, int64_t seq) {
  const std::vector<int64_t>& pos = st.positions;
  const LayerWeights& L = layers_[l];
  const Branch br{drop, seq, static_cast<int64_t>(l)};
  const ModelConfig& c = cfg_;
  const bool p1 = spec_.norm_plus_one;
  const int64_t D = c.head_dim, H = c.hidden_size;
  const ag::Var x = ag::rms_norm(t, h, L.input_norm, eps_, p1, H);
  ag::Var q = proj(t, L, kQ, x, adapter, br), k = proj(t, L, kK, x, adapter, br), v = proj(t, L, kV, x, adapter, br);
  if (spec_.qk_norm) {
    q = ag::rms_norm(t, q, L.q_norm, eps_, p1, D);
    k = ag::rms_norm(t, k, L.k_norm, eps_, p1, D);
  }
  q = ag::rope(t, q, L.rope, D, pos);
  k = ag::rope(t, k, L.rope, D, pos);
  ag::AttnShape as;
  as.heads = c.num_heads;
  as.kv_heads = c.num_kv_heads;
  as.head_dim = D;
  as.scale = spec_.attn_scale > 0 ? spec_.attn_scale : 1.0f / std::sqrt(static_cast<float>(D));
  as.softcap = spec_.attn_softcap;
  as.window = L.window;
  if (!st.seg_start.empty()) as.segment_start = &st.seg_start;
  const ag::Var a = proj(t, L, kO, ag::attention(t, q, k, v, as), adapter, br);
  auto mlp = [&](const ag::Var& in) {
    const ag::Var g = proj(t, L, kGate, in, adapter, br), u = proj(t, L, kUp, in, adapter, br);
    return proj(t, L, kDown, ag::gated(t, g, u, spec_.act), adapter, br);
  };
  if (spec_.sandwich) {
    const ag::Var h1 = ag::add(t, h, ag::rms_norm(t, a, L.post_attn_norm, eps_, p1, H));
    const ag::Var m = mlp(ag::rms_norm(t, h1, L.pre_ff_norm, eps_, p1, H));
    return ag::add(t, h1, ag::rms_norm(t, m, L.post_ff_norm, eps_, p1, H));
  }
  const ag::Var h1 = ag::add(t, h, a);
  return ag::add(t, h1, mlp(ag::rms_norm(t, h1, L.post_attn_norm, eps_, p1, H)));
}

ag::Var CpuEngine::head_logprobs(ag::Tape& t, const ag::Var& h, const std::vector<int32_t>& targets) {
  const ag::Var x = ag::rms_norm(t, h, final_norm_, eps_, spec_.norm_plus_one, cfg_.hidden_size);
  return ag::target_logprobs(t, x, head_, targets, spec_.final_softcap);
}

SequenceLogProbs CpuEngine::forward(const std::vector<TrainSequence>& batch, bool with_adapter) {
  SequenceLogProbs out;
  std::vector<SeqState> states;
  // Only a forward with the adapter takes the pending dropout (DPO's reference forward comes first and leaves it).
  LoraDropout drop;
  if (with_adapter) std::swap(drop, pending_drop_);
  for (size_t si = 0; si < batch.size(); ++si) {
    const TrainSequence& seq = batch[si];
    const std::string which = "sequence " + std::to_string(si);
    if (seq.ids.empty()) throw Error(ErrorKind::InvalidArgument, which + " is empty");
    if (seq.target.size() != seq.ids.size())
      throw Error(ErrorKind::InvalidArgument, which + ": target mask length differs from its ids");
    if (seq.target[0]) throw Error(ErrorKind::InvalidArgument, which + ": position 0 cannot be a target");
    SeqState st;
    st.ids = seq.ids;
    const int64_t T = static_cast<int64_t>(seq.ids.size());
    for (int32_t id : seq.ids)
      if (id < 0 || id >= cfg_.vocab_size)
        throw Error(ErrorKind::InvalidArgument, which + ": token id " + std::to_string(id) +
                                                    " is outside the vocabulary of " + std::to_string(cfg_.vocab_size));
    // Row r predicts token r + 1 when that token is a target.
    st.targets.assign(static_cast<size_t>(T), -1);
    int64_t n = 0;
    for (int64_t j = 1; j < T; ++j)
      if (seq.target[static_cast<size_t>(j)]) {
        st.targets[static_cast<size_t>(j - 1)] = seq.ids[static_cast<size_t>(j)];
        ++n;
      }
    if (seq.segments.empty()) {
      for (int64_t r = 0; r < T; ++r) st.positions.push_back(r);
    } else {
      // A packed row: positions restart and attention stays inside each example; no example predicts the next
      // one's first token.
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
    }
    ag::Tape none(false);
    ag::Var h = ag::embedding(none, st.ids, embed_);
    if (spec_.embed_scale != 1.0f) h = ag::scale(none, h, spec_.embed_scale);
    for (size_t l = 0; l < layers_.size(); ++l) {
      if (with_adapter) st.layer_in.push_back(h);
      h = layer_forward(none, l, h, st, with_adapter, &drop, static_cast<int64_t>(si));
    }
    if (with_adapter) st.layer_in.push_back(h);
    const ag::Var lp = head_logprobs(none, h, st.targets);
    double sum = 0;
    for (int64_t r = 0; r < T; ++r)
      if (st.targets[static_cast<size_t>(r)] >= 0) sum += lp->value[static_cast<size_t>(r)];
    out.sum_logp.push_back(sum);
    out.n_targets.push_back(n);
    if (with_adapter) states.push_back(std::move(st));
  }
  if (with_adapter) saved_ = std::move(states), saved_drop_ = drop;
  return out;
}

void CpuEngine::backward(const std::vector<double>& weight_per_sequence) {
  if (saved_.empty()) throw Error(ErrorKind::InvalidArgument, "backward: no forward with the adapter to go back over");
  if (weight_per_sequence.size() != saved_.size())
    throw Error(ErrorKind::InvalidArgument, "backward: " + std::to_string(weight_per_sequence.size()) +
                                                " weights for a batch of " + std::to_string(saved_.size()));
  for (size_t si = 0; si < saved_.size(); ++si) {
    SeqState& st = saved_[si];
    const float w = static_cast<float>(weight_per_sequence[si]);
    // The head: d (w · Σ logp) / d h_final.
    ag::Var h = ag::from_values(st.layer_in.back()->value, st.layer_in.back()->rows, st.layer_in.back()->cols, true);
    std::vector<float> dh;
    {
      ag::Tape t;
      const ag::Var lp = head_logprobs(t, h, st.targets);
      lp->grad.assign(lp->value.size(), w);
      t.backward();
      dh = std::move(h->grad);
    }
    // Layers, last first: recompute the layer's forward from its saved input, then run its tape back.
    for (size_t l = layers_.size(); l-- > 0;) {
      const ag::Var& in = st.layer_in[l];
      ag::Var x = ag::from_values(in->value, in->rows, in->cols, true);
      ag::Tape t;
      ag::Var y = layer_forward(t, l, x, st, true, &saved_drop_, static_cast<int64_t>(si));
      y->grad = std::move(dh);
      t.backward();
      dh = std::move(x->grad);
      if (dh.empty()) dh.assign(x->value.size(), 0.0f);
      st.layer_in[l].reset();  // done with this checkpoint
    }
  }
  saved_.clear();
}

}  // namespace

std::unique_ptr<LoraGradientEngine> make_cpu_lora_gradient_engine(const Model& model, LoraParams& params) {
  return std::make_unique<CpuEngine>(model, params);
}

bool lora_training_supported(const std::string& t) {
  return t == "llama" || t == "mistral" || t == "qwen2" || t == "qwen3" || t == "gemma3" || t == "gemma3_text";
}

LoraParams lora_params_from_adapter(const lora::AdapterWeights& adapter) {
  LoraParams ps;
  for (const lora::LoraFactor& f : adapter.factors) {
    LoraParam p;
    p.module = f.module;
    p.a = f.a.to(DType::F32).contiguous().clone();
    p.b = f.b.to(DType::F32).contiguous().clone();
    p.grad_a = Tensor::zeros(p.a.shape(), DType::F32);
    p.grad_b = Tensor::zeros(p.b.shape(), DType::F32);
    p.scale = f.scale;
    ps.params.push_back(std::move(p));
  }
  return ps;
}

void zero_grads(LoraParams& params) {
  for (LoraParam& p : params.params) {
    std::fill(p.grad_a.data<float>(), p.grad_a.data<float>() + p.grad_a.numel(), 0.0f);
    std::fill(p.grad_b.data<float>(), p.grad_b.data<float>() + p.grad_b.numel(), 0.0f);
  }
}

}  // namespace lathe::train
