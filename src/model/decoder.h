// A dense decoder-only transformer assembled from shared layers; architectures differ only in the
// DecoderSpec they fill from their config (see arch/*.cc).
#pragma once
#include <memory>
#include <vector>

#include "model/batch_graph.h"
#include "model/batch_rows.h"
#include "model/layers/attention.h"
#include "model/layers/modules.h"
#include "model/model.h"
#include "model/step_graph.h"

namespace lathe {

struct DecoderSpec {
  bool norm_plus_one = false;   // RMSNorm scales by (1 + w) (Gemma)
  bool sandwich_norms = false;  // post-attention / pre- and post-feedforward norms (Gemma 2/3)
  bool qk_norm = false;         // per-head q/k RMSNorm (Qwen3, Gemma 3)
  bool qkv_bias = false;        // Qwen2
  bool mlp_bias = false;
  Activation act = Activation::SiLU;
  float embed_scale = 1.0f;  // Gemma: sqrt(hidden)
  float attn_scale = 0.0f;   // 0 = head_dim^-1/2
  float attn_softcap = 0.0f;
  float final_softcap = 0.0f;
};

class DecoderModel : public Model {
 public:
  DecoderModel(ModelConfig config, Checkpoint ckpt, const DecoderSpec& spec);
  CacheList make_cache(const CacheOptions& options = {}) const override;
  Tensor forward(const std::vector<int32_t>& ids, CacheList& caches, bool all_logits) override;
  Tensor forward(const Batch& batch) override;
  bool replays_decode(const Batch& batch) override;

 private:
  bool replays_decode(const Batch& batch, const RowSpans& s);  // s: the batch laid out
  struct Layer {
    RMSNorm input_norm, post_attn_norm, pre_ff_norm, post_ff_norm;
    Attention attn;
    GatedMLP mlp;
  };
  DecoderSpec spec_;
  Weight embed_, lm_head_;
  std::vector<Layer> layers_;
  RMSNorm final_norm_;
  StepGraph step_graph_;      // decode steps on CUDA
  BatchGraphs batch_graphs_;  // batched decode steps on CUDA
  Tensor forward_tokens(const std::vector<int32_t>& ids, CacheList& caches, bool all_logits);
  Tensor forward_rows(const RowSpans& s);
};

}  // namespace lathe
