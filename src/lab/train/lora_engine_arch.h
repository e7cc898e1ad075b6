// What the LoRA gradient engines (CPU: lora_engine_cpu.h, CUDA: lora_engine_cuda.h) share about the dense
// decoders they train (llama / mistral, qwen2, qwen3, gemma3): the per-family differences of DecoderModel's
// forward, the frozen weights bound on the config's device with each layer's LoRA params matched to its linears,
// and one sequence's targets, positions and packed segments, checked.
#pragma once
#include <string>
#include <vector>

#include "lab/train/autograd.h"
#include "lab/train/lora_gradient.h"
#include "model/model.h"

namespace lathe::train {

// What differs between the dense decoders (as the arch/*.cc builders fill DecoderSpec).
struct ArchSpec {
  bool norm_plus_one = false, sandwich = false, qk_norm = false, qkv_bias = false, mlp_bias = false;
  ag::Gate act = ag::Gate::SiLU;
  float embed_scale = 1.0f, attn_scale = 0.0f, attn_softcap = 0.0f, final_softcap = 0.0f;
};
// Throws Error(Unsupported) for a model type the engines cannot train.
ArchSpec arch_spec(const ModelConfig& c);

// The seven LoRA targets of a layer, in a fixed order.
enum Site { kQ, kK, kV, kO, kGate, kUp, kDown, kSites };
extern const char* const kSiteNames[kSites];

struct LayerWeights {
  Tensor input_norm, post_attn_norm, pre_ff_norm, post_ff_norm, q_norm, k_norm;
  Weight w[kSites];
  Tensor bias[kSites];
  LoraParam* lora[kSites] = {};
  RopeTable rope;
  int64_t window = 0;
};

struct BoundDecoder {
  Weight embed, head;
  Tensor final_norm;
  std::vector<LayerWeights> layers;
};
// Binds the model's checkpoint tensors where cfg.load says (CPU: zero-copy views; a device: uploaded) and matches
// params to the layer linears by module path. Throws InvalidArgument for params that are not F32 2-D with grads
// of their shape, given twice, of the wrong shape, or naming no layer linear; Unsupported for other layer types.
BoundDecoder bind_decoder(const Model& model, const ModelConfig& cfg, const ArchSpec& spec, LoraParams& params);

// The attention scale of a layer: the family's, else 1 / sqrt(head_dim).
float attention_scale(const ModelConfig& c, const ArchSpec& spec);

// One sequence of a batch, checked: per-position targets (row r predicts token r + 1 when that token is a
// target, else -1), positions (restarting at 0 per packed example), per-row segment starts (empty: one example).
struct SequencePlan {
  std::vector<int32_t> ids, targets;
  std::vector<int64_t> positions, seg_start;
  int64_t n_targets = 0;
};
SequencePlan plan_sequence(const TrainSequence& seq, size_t index, int64_t vocab_size);

}  // namespace lathe::train
