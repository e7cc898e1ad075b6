// KV memory accounting for admission: what a sequence of n tokens holds in its attention caches, computed from
// the model config and the cache options (f32 or MLX-quantized K/V; sliding-window layers hold at most their
// window). It is the scheduler's ledger, not an allocator: it decides who runs, so a request that does not fit
// waits instead of exhausting memory.
#pragma once
#include <cstdint>
#include <vector>

#include "cache/layer_cache.h"
#include "model/config.h"

namespace lathe {

class KvBudget {
 public:
  KvBudget(const ModelConfig& config, const CacheOptions& options);
  // Bytes the caches of one sequence holding `tokens` tokens take.
  int64_t bytes_for(int64_t tokens) const;
  // Bytes per token of the full-attention layers (what growth past every window costs).
  int64_t bytes_per_token() const { return full_per_token_; }

 private:
  int64_t full_per_token_ = 0;  // summed over full-attention layers
  struct Window {
    int64_t size, per_token;
  };
  std::vector<Window> windows_;  // sliding layers
};

// Half of the memory the system reports available now: the default --kv-cache-bytes on the CPU.
int64_t default_kv_cache_bytes();

}  // namespace lathe
