#include "model/batch_graph.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <unordered_map>
#include <utility>

#include "cache/quantized_kv_cache.h"
#include "common/error.h"
#include "common/log.h"
#include "tensor/dense_weights.h"

#ifdef LATHE_HAVE_CUDA
#include "tensor/cuda/decode_attention.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/kernels_models.h"
#endif

namespace lathe {

namespace {
std::atomic<int> g_enabled{-1};  // -1: not yet read from the environment
std::atomic<int64_t> g_replays{0};
}  // namespace

bool batch_graphs_enabled() {
  int v = g_enabled.load(std::memory_order_relaxed);
  if (v < 0) {
    v = 1;
    for (const char* name : {"LATHE_CUDA_GRAPHS", "LATHE_CUDA_BATCH_GRAPHS"}) {
      const char* e = std::getenv(name);
      if (e && std::strcmp(e, "0") == 0) v = 0;
    }
    g_enabled.store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

void set_batch_graphs_enabled(bool on) { g_enabled.store(on ? 1 : 0, std::memory_order_relaxed); }

int64_t batch_graph_replays() { return g_replays.load(std::memory_order_relaxed); }

#ifdef LATHE_HAVE_CUDA
namespace {
// The K/V storage a row's caches were made with (the graph's kernels and the padding rows' caches follow it).
CacheOptions storage_of(const CacheList& caches) {
  CacheOptions o;
  if (const auto* q = caches.empty() ? nullptr : dynamic_cast<const QuantizedKVCache*>(caches[0].get())) {
    o.kv_bits = q->bits();
    o.kv_group_size = q->group_size();
  }
  return o;
}
bool same_storage(const CacheOptions& a, const CacheOptions& b) {
  return a.kv_bits == b.kv_bits && (a.kv_bits == 0 || a.kv_group_size == b.kv_group_size);
}
}  // namespace
#endif

#ifdef LATHE_HAVE_CUDA
namespace {

// The bucket a step of n rows runs in (0: none, run eagerly). Powers of two up to 8 keep batches of ≤ 8 rows
// on the kernels that give each row its solo result (exact_decode_rows); wider steps pad by at most a third.
// One row: solo steps over caches the single-step graph cannot replay (quantized K/V).
int64_t bucket_for(int64_t n) {
  static constexpr int64_t kBuckets[] = {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256};
  for (int64_t b : kBuckets)
    if (n <= b) return b;
  return 0;
}

// Device memory one bucket's graph may hold beyond its logits (a capture that needs more runs eagerly).
constexpr size_t kMaxPoolBytes = size_t{1} << 30;

size_t align_up(size_t n) { return (n + 255) / 256 * 256; }

// A row of a layer's append table: dense caches' AppendRow or quantized caches' QuantAppendRow.
constexpr size_t kAppendRowBytes = std::max(sizeof(cuda::AppendRow), sizeof(cuda::QuantAppendRow));

}  // namespace
#endif

// One bucket: its state, graph, logits, and the tables each replay rewrites.
struct BatchGraphs::Entry {
  enum class State { Cold, Warm, Captured, Refused };
  State state = State::Cold;
  int64_t rows = 0;
#ifdef LATHE_HAVE_CUDA
  cuda::Graph* graph = nullptr;
  cuda::GraphArena* arena = nullptr;
#endif
  Tensor out;  // [rows, vocab], written by every replay
  size_t arena_bytes = 0, used = 0;
  int64_t dense_generation = 0;  // dense_weights_generation() at the capture
  struct Layer {
    size_t layer = 0;
    size_t append = 0, attention = 0, copies = 0;  // table offsets in the arena (copies: quantized caches)
    bool quantized = false, fused = false;         // fused: the append table holds QuantAppendRows
    Tensor like;                                   // [1, Hkv, D] in the K/V type
  };
  std::vector<Layer> layers;
  std::unordered_map<const LayerCache*, size_t> where;  // capture only: a real row's cache -> its layer
  const RowSpans* capturing = nullptr;                  // capture only: the step's rows

  void release() {
#ifdef LATHE_HAVE_CUDA
    cuda::graph_destroy(graph);
    cuda::arena_destroy(arena);
    graph = nullptr;
    arena = nullptr;
#endif
    out = Tensor();
    layers.clear();
    where.clear();
    capturing = nullptr;
  }
  ~Entry() { release(); }
};

namespace {
thread_local BatchGraphs::Entry* g_capture = nullptr;  // only while BatchGraphs captures
}  // namespace

bool batch_graph_capturing() { return g_capture != nullptr; }

BatchGraphs::BatchGraphs() = default;
BatchGraphs::~BatchGraphs() = default;

#ifndef LATHE_HAVE_CUDA
bool BatchGraphs::replays(const RowSpans& s) const {
  (void)s;
  return false;
}
#endif

bool BatchGraphs::eligible(const RowSpans& s) {
#ifdef LATHE_HAVE_CUDA
  if (!batch_graphs_enabled() || s.rows() < 1 || s.logit_rows.size() != s.rows() ||
      s.tokens() != static_cast<int64_t>(s.rows()))
    return false;
  const CacheOptions storage = storage_of(*s.caches[0]);
  for (size_t r = 0; r < s.rows(); ++r) {
    if (r > 0 && !same_storage(storage_of(*s.caches[r]), storage)) return false;
    for (const auto& c : *s.caches[r])
      if (!c->graph_appendable()) return false;
  }
  return true;
#else
  (void)s;
  return false;
#endif
}

#ifdef LATHE_HAVE_CUDA
BatchGraphLayer batch_graph_layer(const std::vector<LayerCache*>& caches, const Tensor& like) {
  BatchGraphs::Entry* e = g_capture;
  LATHE_CHECK(e, "batch_graph_layer outside a capture");
  if (caches.size() != static_cast<size_t>(e->rows) || caches.empty())
    throw Error(ErrorKind::Unsupported, "batch graph: a layer's rows are not the step's");
  const auto at = e->where.find(caches[0]);  // row 0 is a real row (padding last)
  if (at == e->where.end() || !e->capturing)
    throw Error(ErrorKind::Unsupported, "batch graph: a layer cache not in the step");
  const size_t layer = at->second;
  for (size_t r = 0; r < caches.size(); ++r)
    if (caches[r] != (*e->capturing->caches[r])[layer].get())
      throw Error(ErrorKind::Unsupported, "batch graph: a layer's caches out of row order");
  const size_t n = caches.size();
  BatchGraphs::Entry::Layer L;
  L.layer = layer;
  L.append = e->used;
  L.attention = align_up(L.append + n * kAppendRowBytes);
  L.copies = align_up(L.attention + n * sizeof(cuda::DecodeRow));
  e->used = align_up(L.copies + 6 * n * sizeof(cuda::CopySegment));
  if (e->used > e->arena_bytes) throw Error(ErrorKind::Unsupported, "batch graph: more attention layers than planned");
  L.like = Tensor::empty(like.shape(), like.dtype(), like.device());
  BatchGraphLayer out;
  out.quantized = dynamic_cast<const QuantizedKVCache*>(caches[0]);
  L.quantized = out.quantized != nullptr;
  L.fused = out.fused_append = L.quantized && quantized_append_covers(like.device(), like.dim(2), out.quantized->bits(),
                                                                      out.quantized->group_size());
  for (LayerCache* c : caches) {
    if (L.quantized) {
      // Room for the token and a view over the rows attention reads (what a replay then rewrites in the table).
      auto* q = dynamic_cast<QuantizedKVCache*>(c);
      const auto d = q && q->bits() == out.quantized->bits() && q->group_size() == out.quantized->group_size()
                         ? q->next_row()
                         : std::nullopt;
      if (!d) throw Error(ErrorKind::Unsupported, "batch graph: a quantized cache cannot take graph rows");
      out.qrows.push_back(*d);
      out.qviews.push_back(q->commit_row());
      continue;
    }
    auto slot = c->graph_append(L.like);
    if (!slot) throw Error(ErrorKind::Unsupported, "batch graph: a cache cannot take graph rows");
    out.rows.push_back(*slot);
  }
  char* host = cuda::arena_host(e->arena);
  char* dev = cuda::arena_dev(e->arena);
  out.append.host = host + L.append;
  out.append.dev = dev + L.append;
  out.attention.host = host + L.attention;
  out.attention.dev = dev + L.attention;
  out.copies.host = host + L.copies;
  out.copies.dev = dev + L.copies;
  e->layers.push_back(std::move(L));
  return out;
}

bool BatchGraphs::replays(const RowSpans& s) const {
  const int64_t bucket = bucket_for(static_cast<int64_t>(s.rows()));
  if (!bucket || s.caches.empty()) return false;
  const CacheOptions storage = storage_of(*s.caches[0]);
  const auto it = buckets_.find({bucket, storage.kv_bits, storage.kv_bits ? storage.kv_group_size : 0});
  return it != buckets_.end() && it->second && it->second->state == Entry::State::Captured &&
         it->second->dense_generation == dense_weights_generation();
}

Tensor BatchGraphs::run(const RowSpans& s, const Step& step, const MakeCache& make_cache) {
  const int64_t B = static_cast<int64_t>(s.rows());
  LATHE_CHECK(!s.device_ids || replays(s), "batch graph: tokens on the device need a captured graph");
  const int64_t bucket = bucket_for(B);
  if (!bucket) return step(s);
  const CacheOptions storage = storage_of(*s.caches[0]);
  auto& slot = buckets_[{bucket, storage.kv_bits, storage.kv_bits ? storage.kv_group_size : 0}];
  if (!slot) {
    slot = std::make_unique<Entry>();
    slot->rows = bucket;
  }
  Entry& e = *slot;
  if (e.state == Entry::State::Refused) return step(s);
  // Dense weight copies dropped since the capture: its GEMMs would read freed memory.
  if (e.state == Entry::State::Captured && e.dense_generation != dense_weights_generation()) {
    e.release();
    e.state = Entry::State::Cold;
  }
  // The padding rows share one cache list of their own, emptied before every step: the k-th takes its row k
  // (a bucket pads fewer rows than one buffer of kKvGrowStep holds, so it never grows in a replay).
  if (bucket > B && (pad_.empty() || !same_storage(pad_options_, storage))) {
    pad_ = make_cache(storage);
    pad_options_ = storage;
  }
  for (auto& c : pad_) c->trim(c->offset());
  RowSpans p = s;
  for (int64_t i = 0; i < bucket - B; ++i) {
    p.start.push_back(p.tokens());
    p.len.push_back(1);
    p.pos0.push_back(i);
    p.caches.push_back(&pad_);
    p.logit_rows.push_back(static_cast<int32_t>(p.tokens()));
    p.ids.push_back(0);
  }
  const Tensor out = run_bucket(e, p, step);
  return out.dim(0) == B ? out : out.slice(0, 0, B);
}

Tensor BatchGraphs::run_bucket(Entry& e, const RowSpans& p, const Step& step) {
  const size_t n = p.rows(), layers = p.caches[0]->size();
  if (e.state == Entry::State::Cold) {  // eagerly first: dense weight copies, cuBLAS plans, caches' buffers
    Tensor out = step(p);
    e.state = Entry::State::Warm;
    return out;
  }
  if (e.state == Entry::State::Captured) {
    char* host = cuda::arena_host(e.arena);
    std::memcpy(host, p.ids.data(), n * sizeof(int32_t));
    for (const Entry::Layer& L : e.layers) {
      auto* app = reinterpret_cast<cuda::AppendRow*>(host + L.append);
      auto* att = reinterpret_cast<cuda::DecodeRow*>(host + L.attention);
      if (L.quantized) {  // fused: the append writes each row's parts; else staging rows, then the copies
        auto* qa = reinterpret_cast<cuda::QuantAppendRow*>(host + L.append);
        auto* cp = reinterpret_cast<cuda::CopySegment*>(host + L.copies);
        for (size_t r = 0; r < n; ++r) {
          const auto d = (*p.caches[r])[L.layer]->graph_append_quantized();
          LATHE_CHECK(d, "batch graph: a quantized cache stopped taking graph rows");
          if (L.fused) {
            for (size_t i = 0; i < 6; ++i) qa[r].dst[i] = d->dst[i];
            qa[r].pos0 = d->row;
          } else {
            app[r].pos0 = d->row;
            for (size_t i = 0; i < 6; ++i) cp[i * n + r].dst = d->dst[i];
          }
          att[r].k = d->base[0];
          att[r].k_scales = d->base[1];
          att[r].k_biases = d->base[2];
          att[r].v = d->base[3];
          att[r].v_scales = d->base[4];
          att[r].v_biases = d->base[5];
          att[r].S = d->row + 1;
          att[r].q_pos0 = d->row;
        }
        continue;
      }
      for (size_t r = 0; r < n; ++r) {
        const auto slot = (*p.caches[r])[L.layer]->graph_append(L.like);
        LATHE_CHECK(slot, "batch graph: a cache stopped taking graph rows");
        void* k = slot->keys->raw();
        void* v = slot->values->raw();
        app[r].keys = k;
        app[r].values = v;
        app[r].row = slot->row;
        app[r].pos0 = slot->row;
        att[r].k = k;
        att[r].v = v;
        att[r].S = slot->row + 1;
        att[r].q_pos0 = slot->row;
      }
    }
    cuda::arena_upload(e.arena);
    // Rows whose tokens are still on the device (the last step's sampled ids) take them over the host copy.
    if (p.device_ids)
      cuda::copy_async(cuda::arena_dev(e.arena), p.device_ids, static_cast<size_t>(p.device_id_rows) * sizeof(int32_t));
    cuda::graph_replay(e.graph);
    g_replays.fetch_add(1, std::memory_order_relaxed);
    return e.out;
  }
  // Warm: capture this step. Every cache first makes room for its token (a capture must not grow one); one
  // that has no buffers yet (a new padding row) gets them from an eager step, and the capture waits a step.
  for (size_t r = 0; r < n; ++r)
    for (auto& c : *p.caches[r])
      if (!c->graph_prepare()) return step(p);
  // The caches' host bookkeeping advances as the capture records (nothing runs until the launch below); if the
  // capture fails it is rolled back and the step runs eagerly.
  std::vector<std::vector<int64_t>> offsets(n);
  e.where.clear();
  for (size_t r = 0; r < n; ++r)
    for (size_t l = 0; l < layers; ++l) {
      const LayerCache* c = (*p.caches[r])[l].get();
      offsets[r].push_back(c->offset());
      if (p.caches[r] != &pad_) e.where[c] = l;
    }
  e.capturing = &p;
  e.arena_bytes =
      align_up(n * sizeof(int32_t)) + layers * (align_up(n * kAppendRowBytes) + align_up(n * sizeof(cuda::DecodeRow)) +
                                                align_up(6 * n * sizeof(cuda::CopySegment)));
  e.used = align_up(n * sizeof(int32_t));
  e.layers.clear();
  try {
    e.arena = cuda::arena_create(e.arena_bytes);
  } catch (const std::exception& ex) {  // no room for the tables (device or pinned memory): run eagerly
    e.release();
    e.state = Entry::State::Refused;
    log::info("decode steps of " + std::to_string(e.rows) + " rows run without a CUDA graph: " + ex.what());
    return step(p);
  }
  std::memcpy(cuda::arena_host(e.arena), p.ids.data(), n * sizeof(int32_t));
  cuda::Graph* g =
      cuda::graph_capture_batch(reinterpret_cast<const int32_t*>(cuda::arena_dev(e.arena)), static_cast<int64_t>(n));
  g_capture = &e;
  Tensor out;
  std::string why;
  try {
    out = step(p);
  } catch (const std::exception& ex) {
    why = ex.what();
  }
  g_capture = nullptr;
  e.where.clear();
  e.capturing = nullptr;
  if (why.empty() && e.layers.size() != layers)  // a layer's per-row state would be baked into the graph
    why = "only " + std::to_string(e.layers.size()) + " of " + std::to_string(layers) + " layers take graph tables";
  cuda::graph_capture_end(g, why.empty());
  if (why.empty() && cuda::graph_pool_bytes(g) > kMaxPoolBytes)
    why = "it would hold " + std::to_string(cuda::graph_pool_bytes(g) >> 20) + " MiB of device memory";
  if (!why.empty()) {
    cuda::graph_destroy(g);
    e.release();
    e.state = Entry::State::Refused;
    for (size_t r = 0; r < n; ++r)
      for (size_t l = 0; l < layers; ++l) {  // a padding cache, listed once per padding row, is trimmed once
        LayerCache& c = *(*p.caches[r])[l];
        if (c.offset() > offsets[r][l]) c.trim(c.offset() - offsets[r][l]);
      }
    log::info("decode steps of " + std::to_string(e.rows) + " rows run without a CUDA graph: " + why);
    return step(p);
  }
  e.graph = g;
  e.out = out;
  e.dense_generation = dense_weights_generation();
  e.state = Entry::State::Captured;
  cuda::arena_upload(e.arena);
  cuda::graph_replay(g);
  return e.out;
}
#else
BatchGraphLayer batch_graph_layer(const std::vector<LayerCache*>& caches, const Tensor& like) {
  (void)caches;
  (void)like;
  throw Error(ErrorKind::Internal, "batch_graph_layer outside a capture");
}

Tensor BatchGraphs::run(const RowSpans& s, const Step& step, const MakeCache& make_cache) {
  (void)make_cache;
  return step(s);
}

Tensor BatchGraphs::run_bucket(Entry& e, const RowSpans& p, const Step& step) {
  (void)e;
  return step(p);
}
#endif

}  // namespace lathe
