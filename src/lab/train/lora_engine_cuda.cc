// CUDA f32 LoRA gradient engine: lora_engine_cpu.cc's layer loop on the device autograd (autograd_cuda.h).
#include "lab/train/lora_engine_cuda.h"

#include "common/error.h"
#include "tensor/device_memory.h"

#ifdef LATHE_HAVE_CUDA
#include "lab/train/autograd_cuda.h"
#include "lab/train/lora_dropout.h"
#include "lab/train/lora_engine_arch.h"
#include "tensor/cuda/train_kernels.h"
#endif

namespace lathe::train {

#ifdef LATHE_HAVE_CUDA
namespace {

// One sequence between forward and backward, with what its ops read on the device.
struct CudaSeq : SequencePlan {
  Tensor seg;                     // I64 [T] segment starts of a packed row, or undefined
  std::vector<Tensor> rope_cs;    // per layer: cos / sin of its rope table at the positions (shared when equal)
  std::vector<dg::Var> layer_in;  // [layers + 1]: each layer's input residual, then the final norm's input
};

bool same_rope(const RopeTable& a, const RopeTable& b) {
  return a.dims == b.dims && a.inv_freq == b.inv_freq && a.attention_scaling == b.attention_scaling;
}

class CudaEngine : public LoraGradientEngine {
 public:
  CudaEngine(const Model& model, LoraParams& params, const CudaEngineOptions& options);
  SequenceLogProbs forward(const std::vector<TrainSequence>& batch, bool with_adapter) override;
  void backward(const std::vector<double>& weight_per_sequence) override;
  void dropout_next(const LoraDropout& d) override { pending_drop_ = d; }

 private:
  struct Branch {
    const LoraDropout* drop = nullptr;
    int64_t seq = 0, layer = 0;
  };
  void prepare(CudaSeq& st) const;
  dg::Var layer_forward(dg::Tape& t, size_t l, const dg::Var& h, const CudaSeq& st, bool adapter,
                        const LoraDropout* drop, int64_t seq);
  dg::Var proj(dg::Tape& t, const LayerWeights& L, Site s, const dg::Var& x, bool adapter, const Branch& br);
  dg::Var head_logprobs(dg::Tape& t, const dg::Var& h, const std::vector<int32_t>& targets);
  dg::DeviceLora& device_lora(const LoraParam* p) { return lora_[static_cast<size_t>(p - params_.params.data())]; }

  CudaEngineOptions options_;
  ModelConfig cfg_;  // the model's, binding on the device in f32
  ArchSpec spec_;
  LoraParams& params_;
  BoundDecoder bound_;
  std::vector<dg::DeviceLora> lora_;  // params_.params[i] on the device
  float eps_ = 1e-6f;
  std::vector<CudaSeq> saved_;
  LoraDropout pending_drop_, saved_drop_;
};

CudaEngine::CudaEngine(const Model& model, LoraParams& params, const CudaEngineOptions& options)
    : options_(options), cfg_(model.config()), spec_(arch_spec(cfg_)), params_(params) {
  if (!cuda_available()) throw Error(ErrorKind::Unsupported, "the CUDA LoRA gradient engine needs a CUDA device");
  cfg_.load.device = Device::CUDA;
  cfg_.load.dtype = DType::F32;  // dense weights widened once: every matmul runs in f32 against the f32 reference
  eps_ = static_cast<float>(cfg_.rms_norm_eps);
  bound_ = bind_decoder(model, cfg_, spec_, params_);
  for (const LoraParam& p : params_.params) {
    dg::DeviceLora d;
    d.a = Tensor::empty(p.a.shape(), DType::F32, Device::CUDA);
    d.b = Tensor::empty(p.b.shape(), DType::F32, Device::CUDA);
    d.grad_a = Tensor::zeros(p.a.shape(), DType::F32, Device::CUDA);
    d.grad_b = Tensor::zeros(p.b.shape(), DType::F32, Device::CUDA);
    d.scale = p.scale;
    lora_.push_back(std::move(d));
  }
}

void CudaEngine::prepare(CudaSeq& st) const {
  if (!st.seg_start.empty()) {
    Tensor host = Tensor::empty({static_cast<int64_t>(st.seg_start.size())}, DType::I64);
    std::copy(st.seg_start.begin(), st.seg_start.end(), host.data<int64_t>());
    st.seg = host.to(Device::CUDA);
  }
  for (size_t l = 0; l < bound_.layers.size(); ++l) {
    const RopeTable& r = bound_.layers[l].rope;
    size_t same = l;
    for (size_t j = 0; j < l && same == l; ++j)
      if (same_rope(bound_.layers[j].rope, r)) same = j;
    st.rope_cs.push_back(same < l ? st.rope_cs[same] : dg::rope_table(r, st.positions));
  }
}

dg::Var CudaEngine::proj(dg::Tape& t, const LayerWeights& L, Site s, const dg::Var& x, bool adapter, const Branch& br) {
  dg::Var y = dg::linear(t, x, L.w[s], L.bias[s].defined() ? &L.bias[s] : nullptr);
  if (!adapter || !L.lora[s]) return y;
  dg::Var in = x;  // dropout on the LoRA input only; the base matmul above read x as it is
  if (br.drop && br.drop->p > 0) {
    const auto mask = dropout_mask(dropout_stream(*br.drop, br.seq, br.layer, s), x->numel(), br.drop->p);
    in = dg::masked(t, x, Tensor::from_floats(*mask, {x->numel()}).to(Device::CUDA));
  }
  return dg::add(t, y, dg::lora(t, in, device_lora(L.lora[s])));
}

// Mirrors CpuEngine::layer_forward (and so DecoderModel::forward_rows) for one layer of one sequence.
dg::Var CudaEngine::layer_forward(dg::Tape& t, size_t l, const dg::Var& h, const CudaSeq& st, bool adapter,
                                  const LoraDropout* drop, int64_t seq) {
  const LayerWeights& L = bound_.layers[l];
  const Branch br{drop, seq, static_cast<int64_t>(l)};
  const ModelConfig& c = cfg_;
  const bool p1 = spec_.norm_plus_one;
  const int64_t D = c.head_dim, H = c.hidden_size;
  const dg::Var x = dg::rms_norm(t, h, L.input_norm, eps_, p1, H);
  dg::Var q = proj(t, L, kQ, x, adapter, br), k = proj(t, L, kK, x, adapter, br), v = proj(t, L, kV, x, adapter, br);
  if (spec_.qk_norm) {
    q = dg::rms_norm(t, q, L.q_norm, eps_, p1, D);
    k = dg::rms_norm(t, k, L.k_norm, eps_, p1, D);
  }
  q = dg::rope(t, q, st.rope_cs[l], D);
  k = dg::rope(t, k, st.rope_cs[l], D);
  dg::AttnShape as;
  as.heads = c.num_heads;
  as.kv_heads = c.num_kv_heads;
  as.head_dim = D;
  as.scale = attention_scale(c, spec_);
  as.softcap = spec_.attn_softcap;
  as.window = L.window;
  as.segment_start = st.seg;
  const dg::Var a = proj(t, L, kO, dg::attention(t, q, k, v, as), adapter, br);
  auto mlp = [&](const dg::Var& in) {
    const dg::Var g = proj(t, L, kGate, in, adapter, br), u = proj(t, L, kUp, in, adapter, br);
    return proj(t, L, kDown, dg::gated(t, g, u, spec_.act), adapter, br);
  };
  if (spec_.sandwich) {
    const dg::Var h1 = dg::add(t, h, dg::rms_norm(t, a, L.post_attn_norm, eps_, p1, H));
    const dg::Var m = mlp(dg::rms_norm(t, h1, L.pre_ff_norm, eps_, p1, H));
    return dg::add(t, h1, dg::rms_norm(t, m, L.post_ff_norm, eps_, p1, H));
  }
  const dg::Var h1 = dg::add(t, h, a);
  return dg::add(t, h1, mlp(dg::rms_norm(t, h1, L.post_attn_norm, eps_, p1, H)));
}

dg::Var CudaEngine::head_logprobs(dg::Tape& t, const dg::Var& h, const std::vector<int32_t>& targets) {
  const dg::Var x = dg::rms_norm(t, h, bound_.final_norm, eps_, spec_.norm_plus_one, cfg_.hidden_size);
  return dg::target_logprobs(t, x, bound_.head, targets, spec_.final_softcap);
}

SequenceLogProbs CudaEngine::forward(const std::vector<TrainSequence>& batch, bool with_adapter) {
  cuda::train::set_sgemm_bf16(options_.bf16_matmul);
  SequenceLogProbs out;
  std::vector<CudaSeq> states;
  LoraDropout drop;  // only a forward with the adapter takes the pending dropout, as on the CPU
  if (with_adapter) {
    std::swap(drop, pending_drop_);
    for (size_t i = 0; i < params_.params.size(); ++i) {  // the trainer's current factors
      const LoraParam& p = params_.params[i];
      device_copy(lora_[i].a.raw(), p.a.raw(), p.a.nbytes(), Device::CUDA, Device::CPU);
      device_copy(lora_[i].b.raw(), p.b.raw(), p.b.nbytes(), Device::CUDA, Device::CPU);
    }
  }
  for (size_t si = 0; si < batch.size(); ++si) {
    CudaSeq st;
    static_cast<SequencePlan&>(st) = plan_sequence(batch[si], si, cfg_.vocab_size);
    prepare(st);
    dg::Tape none(false);
    dg::Var h = dg::embedding(none, st.ids, bound_.embed);
    if (spec_.embed_scale != 1.0f) h = dg::scale(none, h, spec_.embed_scale);
    for (size_t l = 0; l < bound_.layers.size(); ++l) {
      if (with_adapter) st.layer_in.push_back(h);
      h = layer_forward(none, l, h, st, with_adapter, &drop, static_cast<int64_t>(si));
    }
    if (with_adapter) st.layer_in.push_back(h);
    const std::vector<float> lp = dg::to_host(head_logprobs(none, h, st.targets)->value);
    double sum = 0;
    for (size_t r = 0; r < lp.size(); ++r)
      if (st.targets[r] >= 0) sum += lp[r];
    out.sum_logp.push_back(sum);
    out.n_targets.push_back(st.n_targets);
    if (with_adapter) states.push_back(std::move(st));
  }
  if (with_adapter) saved_ = std::move(states), saved_drop_ = drop;
  return out;
}

void CudaEngine::backward(const std::vector<double>& weight_per_sequence) {
  if (saved_.empty()) throw Error(ErrorKind::InvalidArgument, "backward: no forward with the adapter to go back over");
  if (weight_per_sequence.size() != saved_.size())
    throw Error(ErrorKind::InvalidArgument, "backward: " + std::to_string(weight_per_sequence.size()) +
                                                " weights for a batch of " + std::to_string(saved_.size()));
  cuda::train::set_sgemm_bf16(options_.bf16_matmul);
  for (dg::DeviceLora& d : lora_) {
    device_memset_zero(d.grad_a.raw(), d.grad_a.nbytes());
    device_memset_zero(d.grad_b.raw(), d.grad_b.nbytes());
  }
  for (size_t si = 0; si < saved_.size(); ++si) {
    CudaSeq& st = saved_[si];
    Tensor dh;
    {  // the head: d (w · Σ logp) / d h_final
      const dg::Var h = dg::leaf(st.layer_in.back()->value, true);
      dg::Tape t;
      const dg::Var lp = head_logprobs(t, h, st.targets);
      dg::seed_grad(lp, static_cast<float>(weight_per_sequence[si]));
      t.backward();
      h->g();  // zeros if nothing flowed back
      dh = std::move(h->grad);
    }
    // Layers, last first: recompute the layer's forward from its saved input, then run its tape back.
    for (size_t l = bound_.layers.size(); l-- > 0;) {
      const dg::Var x = dg::leaf(st.layer_in[l]->value, true);
      dg::Tape t;
      const dg::Var y = layer_forward(t, l, x, st, true, &saved_drop_, static_cast<int64_t>(si));
      y->grad = std::move(dh);
      t.backward();
      x->g();
      dh = std::move(x->grad);
      st.layer_in[l].reset();  // done with this checkpoint
    }
  }
  saved_.clear();
  // The params' host grads accumulate, as the CPU engine's do.
  for (size_t i = 0; i < params_.params.size(); ++i) {
    LoraParam& p = params_.params[i];
    for (auto [dev, host] : {std::pair{&lora_[i].grad_a, &p.grad_a}, std::pair{&lora_[i].grad_b, &p.grad_b}}) {
      const std::vector<float> g = dev->to_floats();
      float* h = host->data<float>();
      for (size_t j = 0; j < g.size(); ++j) h[j] += g[j];
    }
  }
}

}  // namespace

bool cuda_training_available() { return cuda_available(); }

std::unique_ptr<LoraGradientEngine> make_cuda_lora_gradient_engine(const Model& model, LoraParams& params,
                                                                   const CudaEngineOptions& options) {
  return std::make_unique<CudaEngine>(model, params, options);
}

#else

bool cuda_training_available() { return false; }

std::unique_ptr<LoraGradientEngine> make_cuda_lora_gradient_engine(const Model&, LoraParams&,
                                                                   const CudaEngineOptions&) {
  throw Error(ErrorKind::Unsupported, "this build of lathe has no CUDA backend (the CUDA LoRA gradient engine)");
}

#endif

}  // namespace lathe::train
