#include "engine/kv_budget.h"

#include <algorithm>

#include <unistd.h>

namespace lathe {

KvBudget::KvBudget(const ModelConfig& c, const CacheOptions& o) {
  const int64_t head_dim = c.head_dim > 0 ? c.head_dim : (c.num_heads > 0 ? c.hidden_size / c.num_heads : 0);
  const int64_t kv_heads = c.num_kv_heads > 0 ? c.num_kv_heads : c.num_heads;
  const int64_t values = 2 * kv_heads * head_dim;  // K and V
  // f32 K/V (bf16 on the CPU with cpu_kv_bf16; a device's bf16 cache is counted at f32, erring on the safe side),
  // or packed bits plus a scale and a bias per group.
  const int64_t per_token = o.kv_bits == 0 ? values * (o.cpu_kv_bf16 ? 2 : 4)
                                           : values * o.kv_bits / 8 + (values / std::max(1, o.kv_group_size)) * 2 * 4;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string type = static_cast<size_t>(l) < c.layer_types.size() ? c.layer_types[static_cast<size_t>(l)]
                                                                           : std::string("full_attention");
    if (type == "linear_attention") continue;  // a fixed state per sequence, not per token
    if (type == "sliding_attention" && c.sliding_window > 0)
      windows_.push_back({c.sliding_window, per_token});
    else
      full_per_token_ += per_token;
  }
  if (full_per_token_ == 0 && windows_.empty()) full_per_token_ = 1;  // never zero: admission must still count
}

int64_t KvBudget::bytes_for(int64_t tokens) const {
  int64_t b = full_per_token_ * tokens;
  for (const Window& w : windows_) b += std::min(tokens, w.size) * w.per_token;
  return b;
}

int64_t default_kv_cache_bytes() {
  const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return int64_t{4} << 30;
  return static_cast<int64_t>(pages) * page / 2;
}

}  // namespace lathe
