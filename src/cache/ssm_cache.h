// State of a Gated DeltaNet (linear attention) layer: the conv window (the last K−1 inputs of the depthwise
// conv, [K−1, conv_dim]) and the f32 recurrent state [Hv, Dv, Dk] (mlx-lm ArraysCache layout without the batch
// dim). Everything before is folded into the state, so it cannot be trimmed.
#pragma once
#include "cache/layer_cache.h"

namespace lathe {

class SSMCache : public LayerCache {
 public:
  const char* kind() const override { return "ssm"; }
  int64_t offset() const override { return offset_; }
  KVView update(const Tensor& k, const Tensor& v) override;  // throws: an SSM layer has no K/V
  CacheState state() const override;
  void restore(const CacheState& s) override;
  bool can_trim(int64_t n) const override { return n == 0; }
  int64_t trim(int64_t) override { return 0; }
  size_t bytes() const override;
  // Everything before is folded into the state: a copy of it, at its own length only.
  bool can_fork(int64_t tokens) const override { return kv_fork_copies() && tokens == offset_; }
  std::unique_ptr<LayerCache> fork(int64_t tokens) const override;

  // The states, created zeroed on `device` on first use with these shapes (checked against existing ones).
  Tensor& conv_state(int64_t rows, int64_t channels, Device device = Device::CPU);
  Tensor& recurrent_state(int64_t heads, int64_t v_dim, int64_t k_dim, Device device = Device::CPU);
  void advance(int64_t tokens) { offset_ += tokens; }

 private:
  Tensor conv_, recurrent_;
  int64_t offset_ = 0;
};

}  // namespace lathe
