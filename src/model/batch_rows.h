// How a batched forward lays out its rows: every row's tokens concatenated into one [N, ...] activation (one
// embedding, one pass of each norm and linear over all rows), with each row's span, first position and
// caches, so the position-dependent parts (RoPE, cache writes, attention, SSM recurrences) run per row.
#pragma once
#include <cstdint>
#include <vector>

#include "model/batch.h"
#include "tensor/tensor.h"

namespace lathe {

struct RowSpans {
  std::vector<int32_t> ids;             // all rows' tokens, row after row
  std::vector<int64_t> start, len;      // row r's tokens are ids[start[r], start[r] + len[r])
  std::vector<int64_t> pos0;            // position of row r's first token (its caches' offset before the step)
  std::vector<CacheList*> caches;       // row r's sequence state
  std::vector<int32_t> logit_rows;      // indices into ids of the tokens whose logits are returned, in order
  const int32_t* device_ids = nullptr;  // Batch::device_ids: the first device_id_rows rows' tokens, on the device
  int64_t device_id_rows = 0;
  size_t rows() const { return start.size(); }
  int64_t tokens() const { return static_cast<int64_t>(ids.size()); }
};

// Validates the batch (non-empty rows, caches of `cache_count` layers, no sequence twice) and lays it out;
// positions come from layer `pos_layer` of each row's caches.
RowSpans layout_rows(const Batch& batch, size_t cache_count, size_t pos_layer = 0);

// One sequence as a one-row layout (the single-sequence forward): logits for every token or the last.
RowSpans single_row(const std::vector<int32_t>& ids, CacheList& caches, bool all_logits);

// Row r of an [N, ...] tensor laid out by spans: a view of its len[r] leading-dim rows.
Tensor row_part(const Tensor& x, const RowSpans& s, size_t r);
// Concatenates tensors along dim 0 (same trailing shape, type and device) into a new contiguous tensor.
Tensor concat_rows(const std::vector<Tensor>& parts);
// The rows of h (the final hidden states, [N, hidden]) whose logits the batch asked for.
Tensor logit_inputs(const Tensor& h, const RowSpans& s);

}  // namespace lathe
