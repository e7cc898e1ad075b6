// CPU f32 LoRA gradient engine: DecoderModel's forward on the autograd tape with per-layer checkpointing.
#include "lab/train/lora_engine_cpu.h"

#include "common/error.h"
#include "lab/train/autograd.h"
#include "lab/train/lora_dropout.h"
#include "lab/train/lora_engine_arch.h"

namespace lathe::train {
namespace {

// One sequence between forward and backward: its ids, per-position targets (the next token or -1), each
// layer's input residual and the final residual.
struct SeqState : SequencePlan {
  std::vector<ag::Var> layer_in;  // [layers + 1]: the last one is the final norm's input
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
  BoundDecoder bound_;
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
  eps_ = static_cast<float>(cfg_.rms_norm_eps);
  bound_ = bind_decoder(model_, cfg_, spec_, params_);
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
  const LayerWeights& L = bound_.layers[l];
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
  as.scale = attention_scale(c, spec_);
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
  const ag::Var x = ag::rms_norm(t, h, bound_.final_norm, eps_, spec_.norm_plus_one, cfg_.hidden_size);
  return ag::target_logprobs(t, x, bound_.head, targets, spec_.final_softcap);
}

SequenceLogProbs CpuEngine::forward(const std::vector<TrainSequence>& batch, bool with_adapter) {
  SequenceLogProbs out;
  std::vector<SeqState> states;
  // Only a forward with the adapter takes the pending dropout (DPO's reference forward comes first and leaves it).
  LoraDropout drop;
  if (with_adapter) std::swap(drop, pending_drop_);
  for (size_t si = 0; si < batch.size(); ++si) {
    SeqState st;
    static_cast<SequencePlan&>(st) = plan_sequence(batch[si], si, cfg_.vocab_size);
    const int64_t T = static_cast<int64_t>(st.ids.size()), n = st.n_targets;
    ag::Tape none(false);
    ag::Var h = ag::embedding(none, st.ids, bound_.embed);
    if (spec_.embed_scale != 1.0f) h = ag::scale(none, h, spec_.embed_scale);
    for (size_t l = 0; l < bound_.layers.size(); ++l) {
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
    for (size_t l = bound_.layers.size(); l-- > 0;) {
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
