// The model interface the engine drives: make caches, run ids through (prefill or decode), get logits.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "cache/layer_cache.h"
#include "io/checkpoint.h"
#include "lora/linear_sites.h"
#include "model/batch.h"
#include "model/config.h"

namespace lathe {

class Model {
 public:
  virtual ~Model() = default;
  const ModelConfig& config() const { return config_; }
  const Checkpoint& checkpoint() const { return ckpt_; }
  // The linear layers LoRA adapters attach to (from the weight binder; empty for a model that records none).
  std::shared_ptr<const lora::LinearSites> linear_sites() const { return linear_sites_; }

  // One cache per layer that keeps state (KV-shared layers have none); options pick quantized KV storage.
  virtual CacheList make_cache(const CacheOptions& options = {}) const = 0;
  // Runs ids after what the caches hold. Returns f32 logits [T, vocab] (all_logits) or [1, vocab] (last).
  virtual Tensor forward(const std::vector<int32_t>& ids, CacheList& caches, bool all_logits = true) = 0;
  // One step over many sequences: f32 logits [batch.logit_rows(), vocab] on the model's device, one row per
  // row that wants logits, in order. The base version runs the rows one after another (correct, not fast);
  // architectures override it to share weight reads across rows.
  virtual Tensor forward(const Batch& batch);
  // Whether forward(batch) would replay a captured decode graph (every row one token, the base model), so the
  // step may take its tokens from the device (Batch::device_ids) and be queued before the last step's ids are read.
  virtual bool replays_decode(const Batch& batch) {
    (void)batch;
    return false;
  }

 protected:
  Model(ModelConfig config, Checkpoint ckpt) : config_(std::move(config)), ckpt_(std::move(ckpt)) {}
  ModelConfig config_;
  Checkpoint ckpt_;  // keeps the weight mappings alive
  std::shared_ptr<const lora::LinearSites> linear_sites_;
};

// Reads DIR/config.json, picks the architecture by model_type and binds the weights; with a CUDA device the
// weights are uploaded once here (dense ones converted to the activation type) and caches live on the device.
std::unique_ptr<Model> load_model(const std::string& dir, const LoadOptions& options = {});
std::vector<std::string> supported_model_types();

}  // namespace lathe
