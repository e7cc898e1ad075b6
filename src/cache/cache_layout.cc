#include "cache/cache_layout.h"

#include "model/model.h"

namespace lathe {

CacheLayout probe_cache_layout(Model& model, const CacheOptions& options) {
  CacheList caches = model.make_cache(options);
  model.forward(std::vector<int32_t>{0}, caches, false);
  CacheLayout layout;
  layout.device = model.config().load.device;
  for (const auto& c : caches) {
    const CacheState s = c->state();
    CacheLayout::Layer layer;
    layer.kind = s.kind;
    for (const char* key : {"max_size", "bits", "group_size"}) {
      auto it = s.meta.find(key);
      if (it != s.meta.end()) layer.meta[key] = it->second;
    }
    for (const auto& [name, t] : s.tensors) layer.tensors.push_back({name, t.dtype(), t.shape()});
    layout.layers.push_back(std::move(layer));
  }
  return layout;
}

}  // namespace lathe
