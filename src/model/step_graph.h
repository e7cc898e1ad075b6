// Replays single-token decode steps from a captured CUDA graph, so a token costs one graph launch instead of
// hundreds of kernel launches and their host-side work. The first step at a given set of cache buffers is
// captured (and run); later steps at other positions replay it: kernels read the position offset and the
// token id from device memory, and each cache advances its host-side offset. Device-agnostic for model code:
// on the CPU, with caches that cannot append in place (ring buffers, a full KV block), or with
// LATHE_CUDA_GRAPHS=0, the step simply runs.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "cache/layer_cache.h"
#include "tensor/tensor.h"

namespace lathe {

class StepGraph {
 public:
  StepGraph() = default;
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;
  ~StepGraph();
  // The returned logits stay valid until the next step. `extra_key`: anything else the step's kernels read
  // through baked-in pointers (a LoRA slot's descriptors), kept alive by `hold` while the graph exists.
  Tensor run(int32_t token, CacheList& caches, const std::function<Tensor()>& step, const void* extra_key = nullptr,
             std::shared_ptr<const void> hold = nullptr);

 private:
  void reset();
  void* graph_ = nullptr;  // cuda::Graph
  std::vector<const void*> key_;
  [[maybe_unused]] int64_t pos_ = 0;  // position of the captured step (unused without CUDA)
  Tensor out_;
  std::shared_ptr<const void> hold_;
};

}  // namespace lathe
