// The batched engine contract ([core]): one forward over ragged rows, each a prefill chunk or a decode token of
// its own sequence. Rows share every weight read; positions come from each row's sequence state, so a step for
// N sequences is one call and needs no global step state.
#pragma once
#include <cstdint>
#include <vector>

#include "cache/layer_cache.h"

namespace lathe {

struct BatchRow {
  std::vector<int32_t> ids;     // tokens to run after what the row's sequence already holds (≥ 1)
  CacheList* caches = nullptr;  // the row's sequence state (from Model::make_cache); advanced by forward
  bool want_logits = true;      // return logits for the row's last token
  int adapter_slot = -1;        // per-row adapter set ([lora]); -1 = base model
};

struct Batch {
  std::vector<BatchRow> rows;
  // On CUDA, for a step Model::replays_decode() accepted: row i's one token is device_ids[i] (the previous step's
  // sampled ids, still on the device); rows[i].ids then give only the row's length (one token), not its value.
  const int32_t* device_ids = nullptr;
  // Rows whose logits forward returns, in row order.
  int64_t logit_rows() const {
    int64_t n = 0;
    for (const auto& r : rows) n += r.want_logits ? 1 : 0;
    return n;
  }
};

}  // namespace lathe
