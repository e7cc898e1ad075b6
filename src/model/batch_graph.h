// Replays batched decode steps (every row one token and its logits) from CUDA graphs captured per batch-size
// bucket, so a 64-row step costs one graph launch and a table upload instead of ~15 launches per layer and
// their host-side work (which took longer than the GPU's step). A step of B rows runs in the smallest bucket
// ≥ B; the extra rows decode token 0 into one cache list of their own, emptied every step, and their logits are
// dropped.
// Per-row state the kernels read — token ids, each row's cache buffers and position — lives in tables at
// fixed device addresses that each replay rewrites (one upload), so a graph stays valid as rows come and go
// and contexts grow. A bucket's first step runs eagerly (creating what its kernels need), the second is
// captured; a step the graphs cannot hold (prefill rows, adapters, ring caches, paged CPU rows) runs eagerly.
// Quantized caches take graphs too: each replay rewrites their rows' copy destinations and attention tables.
// A solo step whose caches the single-step graph (step_graph.h) cannot replay takes a bucket of one row.
// LATHE_CUDA_BATCH_GRAPHS=0 (or LATHE_CUDA_GRAPHS=0) turns them off.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "cache/layer_cache.h"
#include "model/batch_rows.h"
#include "tensor/ops_extra.h"

namespace lathe {

class BatchGraphs {
 public:
  using Step = std::function<Tensor(const RowSpans&)>;
  using MakeCache = std::function<CacheList(const CacheOptions&)>;
  BatchGraphs();
  BatchGraphs(const BatchGraphs&) = delete;
  BatchGraphs& operator=(const BatchGraphs&) = delete;
  ~BatchGraphs();
  // Whether a step over these rows may come from a graph: on a CUDA build with graphs on, rows of one token
  // each, every row's logits, every cache able to take a graph row, every row's caches of one kind.
  static bool eligible(const RowSpans& s);
  // The step's logits [rows, vocab] (valid until the next step): replayed, captured, or step(s) itself.
  // make_cache: an empty cache list of the model with the given options, for the padding rows.
  Tensor run(const RowSpans& s, const Step& step, const MakeCache& make_cache);
  // Whether run(s) would replay a captured graph (s eligible): only such a step may take s.device_ids.
  bool replays(const RowSpans& s) const;
  struct Entry;  // one bucket (batch_graph.cc)

 private:
  Tensor run_bucket(Entry& e, const RowSpans& s, const Step& step);
  // Per bucket and K/V storage (bits, group size: 0 for full precision), which the kernels bake in.
  std::map<std::tuple<int64_t, int, int>, std::unique_ptr<Entry>> buckets_;
  CacheList pad_;  // the padding rows' caches, made with pad_options_
  CacheOptions pad_options_;
};

// While BatchGraphs captures a step on this thread: the tables of the attention layer whose row caches are
// `caches` (in row order). Takes room for each row's token (LayerCache::graph_append) and returns the rows'
// slots; `like` is a [1, Hkv, D] row in the K/V type. Throws outside a capture, or for caches it cannot take.
// Quantized caches (QuantizedKVCache) give their rows' destinations, views over the rows attention reads, and
// a table for the batched copy of the step's quantized rows instead.
class QuantizedKVCache;
struct BatchGraphLayer {
  GraphTable append, attention, copies;
  std::vector<DirectRow> rows;
  const QuantizedKVCache* quantized = nullptr;  // row 0's cache where the layer's caches are quantized
  bool fused_append = false;                    // quantized rows appended by one fused launch (no copies table)
  std::vector<QuantizedRowDest> qrows;
  std::vector<KVView> qviews;
};
bool batch_graph_capturing();
// On unless LATHE_CUDA_BATCH_GRAPHS=0 or LATHE_CUDA_GRAPHS=0; tests switch them for comparisons.
bool batch_graphs_enabled();
void set_batch_graphs_enabled(bool on);
// Steps replayed from batch graphs in this process (tests, benchmarks).
int64_t batch_graph_replays();
BatchGraphLayer batch_graph_layer(const std::vector<LayerCache*>& caches, const Tensor& like);

}  // namespace lathe
