#include "model/step_graph.h"

#include <algorithm>

#ifdef LATHE_HAVE_CUDA
#include "common/env.h"
#include "tensor/cuda/kernels.h"
#endif

namespace lathe {

StepGraph::~StepGraph() { reset(); }

void StepGraph::reset() {
#ifdef LATHE_HAVE_CUDA
  cuda::graph_destroy(static_cast<cuda::Graph*>(graph_));
#endif
  graph_ = nullptr;
  key_.clear();
  out_ = Tensor();
  hold_.reset();
}

Tensor StepGraph::run(int32_t token, CacheList& caches, const std::function<Tensor()>& step, const void* extra_key,
                      std::shared_ptr<const void> hold) {
#ifdef LATHE_HAVE_CUDA
  static const bool enabled = env_switch("LATHE_CUDA_GRAPHS");
  std::vector<const void*> key;
  for (const auto& c : caches) key.push_back(c->replay_buffer());
  const bool replayable = enabled && !caches.empty() && std::find(key.begin(), key.end(), nullptr) == key.end();
  if (!replayable) {
    reset();
    return step();
  }
  key.push_back(extra_key);
  const int64_t pos = caches.front()->offset();
  if (graph_ && key == key_) {
    cuda::graph_launch(static_cast<cuda::Graph*>(graph_), pos - pos_, token);
    for (auto& c : caches) c->replay_append();
    return out_;
  }
  reset();
  auto* g = cuda::graph_capture(token);
  try {
    out_ = step();
  } catch (...) {
    cuda::graph_capture_end(g, false);
    cuda::graph_destroy(g);
    out_ = Tensor();
    throw;
  }
  cuda::graph_capture_end(g, true);
  graph_ = g;
  key_ = key;
  pos_ = pos;
  hold_ = std::move(hold);
  cuda::graph_launch(g, 0, token);  // capturing recorded the kernels without running them
  return out_;
#else
  (void)token;
  (void)caches;
  (void)extra_key;
  (void)hold;
  return step();
#endif
}

}  // namespace lathe
