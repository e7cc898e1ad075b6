// Per-layer attention caches. Each kind exposes its offset, an exact state (tensors + integer metadata) that can
// be snapshotted and restored bit-for-bit, whether and how far it can be trimmed, and its size in bytes.
// The state is what the KV file format persists.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tensor/ops.h"
#include "tensor/tensor.h"

namespace lathe {

// Full KV caches grow in steps of this many rows, so decode does not reallocate every token.
inline constexpr int64_t kKvGrowStep = 256;
// The rows a contiguous cache growing to hold `tokens` rows allocates: `tokens` rounded up to kKvGrowStep, then,
// on a device, every row its buffers' allocations hold anyway (the caching allocator rounds sizes past 1 MiB to
// 2 MiB, so a 4B model's 2 KiB rows grow by 1,024 tokens, not 256: a quarter of the reallocations and copies for
// the same memory). row_bytes: each buffer's bytes per row.
int64_t kv_grow_capacity(int64_t tokens, const std::vector<int64_t>& row_bytes, Device device);
int64_t kv_row_bytes(const Tensor& rows);  // bytes of one row (dimension 0) of `rows`

struct CacheState {
  std::string kind;                                     // "kv", "rotating", ...
  std::vector<std::pair<std::string, Tensor>> tensors;  // e.g. {"keys", ...}, {"values", ...}
  std::map<std::string, int64_t> meta;                  // e.g. offset, idx, max_size
};

// What attention sees after an update: keys/values [S, Hkv, D] and each key's absolute position. Quantized
// caches hand out their MLX triples instead (qk/qv rows s·kv_heads + h), which attention reads directly.
struct KVView {
  Tensor k, v;
  bool quantized = false;
  QuantizedMatrix qk, qv;
  int64_t kv_heads = 0;
  int64_t pos0 = 0;                // position of key 0 when positions is empty
  std::vector<int64_t> positions;  // explicit per-key positions (ring buffers)
};

// Where a decode step's K/V row goes in a cache's buffers [capacity, Hkv, D].
struct DirectRow {
  Tensor* keys = nullptr;
  Tensor* values = nullptr;
  int64_t row = 0;
};

// Where one token's row of a quantized cache goes (QuantizedKVCache): the token's row in each of the six parts
// (key codes, scales, biases, value codes, scales, biases), the bytes of a row of each, and each part's row 0
// (attention reads rows [0, row] of the same buffers).
struct QuantizedRowDest {
  void* dst[6] = {};
  int64_t bytes[6] = {};
  const void* base[6] = {};
  int64_t row = 0;
};

class LayerCache {
 public:
  virtual ~LayerCache() = default;
  virtual const char* kind() const = 0;
  virtual int64_t offset() const = 0;  // tokens seen so far
  // Appends k/v [T, Hkv, D] (f32) and returns everything attention must see for those T queries.
  virtual KVView update(const Tensor& k, const Tensor& v) = 0;
  virtual CacheState state() const = 0;
  virtual void restore(const CacheState& s) = 0;  // throws on a state of another kind or shape
  virtual bool can_trim(int64_t n) const = 0;
  virtual int64_t trim(int64_t n) = 0;  // drops the last n tokens; returns how many were dropped
  virtual size_t bytes() const = 0;
  // For decode steps replayed from a CUDA graph (model/step_graph.h): the device buffer the next one-token
  // update writes in place, or null when it cannot (ring buffers, a full block, caches on the CPU)...
  virtual const void* replay_buffer() const { return nullptr; }
  // ...and the host-side bookkeeping of one token whose rows a replayed step wrote.
  virtual void replay_append() {}
  // Direct writes (ops_extra.h qkv_rope_append and its batched forms): room for n more tokens and the row the
  // first goes to (the others follow it), for a caller that writes the rows itself; nullopt when this kind cannot
  // take direct writes (then use update()). like: [1, Hkv, D] in the K/V type. commit_direct_rows(n) then counts
  // the tokens and returns what update() would have. One token: a decode step; several: prefill rows
  // (Attention::prefill_direct).
  virtual std::optional<DirectRow> direct_rows(const Tensor& like, int64_t n) {
    (void)like;
    (void)n;
    return std::nullopt;
  }
  virtual KVView commit_direct_rows(int64_t n);
  std::optional<DirectRow> direct_row(const Tensor& like) { return direct_rows(like, 1); }
  KVView commit_direct() { return commit_direct_rows(1); }
  // Batched decode graphs (model/batch_graph.h): room for one more token, counted at once, and where its row
  // goes (what direct_row then commit_direct do, without building the view: attention reads rows [0, row]
  // of the same buffers); nullopt when this kind cannot. graph_appendable(): whether it can now.
  virtual bool graph_appendable() const { return false; }
  // Room for one more token made now, before a capture records graph_append (whose growth would otherwise
  // be captured, not run); false when there are no buffers to grow yet.
  virtual bool graph_prepare() { return false; }
  virtual std::optional<DirectRow> graph_append(const Tensor& like) {
    (void)like;
    return std::nullopt;
  }
  // graph_append for caches that store rows quantized: where the token's row goes, the token counted at once.
  virtual std::optional<QuantizedRowDest> graph_append_quantized() { return std::nullopt; }
  // Prefix sharing (the prompt cache's RAM tier, kv_block_pool.h): a cache of this one's first `tokens` tokens,
  // equal to what running them would leave. Paged caches map the same blocks copy-on-write; contiguous buffers
  // (device caches), rings and SSM states are copied (a device-to-device copy of a prefix is far cheaper than
  // prefilling it again). false / null where the state for `tokens` is gone: a ring that has dropped tokens that
  // prefix still sees, an SSM state at any length but its own.
  virtual bool can_fork(int64_t tokens) const {
    (void)tokens;
    return false;
  }
  virtual std::unique_ptr<LayerCache> fork(int64_t tokens) const {
    (void)tokens;
    return nullptr;
  }
};

using CacheList = std::vector<std::unique_ptr<LayerCache>>;

// Whether caches that cannot share blocks fork by copying (LATHE_KV_FORK_COPY=0: they do not, and a kept cache is
// taken by the one request it serves, as before; for same-run comparisons).
bool kv_fork_copies();

// How a model builds its attention caches: kv_bits 0 keeps K/V in full precision; 4 or 8 stores them as MLX
// affine triples with kv_group_size (32 or 64) values per group. Full precision on the CPU is f32, or bf16 with
// cpu_kv_bf16 (half the bytes each decode step's attention reads; the CLI's default outside --exact).
struct CacheOptions {
  int kv_bits = 0;
  int kv_group_size = 64;
  bool cpu_kv_bf16 = false;
};
// The attention cache for one layer: rotating (window > 0) or growing, quantized per the options.
std::unique_ptr<LayerCache> make_attention_cache(int64_t window, const CacheOptions& options);
// Throws InvalidArgument unless bits is 0, 4 or 8 and the group size 32 or 64.
void validate_cache_options(const CacheOptions& options);
// x as a CPU cache of type cpu_store keeps its rows (converted when on the CPU in another type; else x).
Tensor kv_rows_as(const Tensor& x, DType cpu_store);

// Growing cache for full-attention layers.
class KVCache : public LayerCache {
 public:
  const char* kind() const override { return "kv"; }
  int64_t offset() const override { return offset_; }
  KVView update(const Tensor& k, const Tensor& v) override;
  CacheState state() const override;
  void restore(const CacheState& s) override;
  bool can_trim(int64_t n) const override { return n >= 0 && n <= offset_; }
  int64_t trim(int64_t n) override;
  size_t bytes() const override;
  const void* replay_buffer() const override;
  void replay_append() override { ++offset_; }
  std::optional<DirectRow> direct_rows(const Tensor& like, int64_t n) override;
  KVView commit_direct_rows(int64_t n) override;
  bool graph_appendable() const override { return keys_.defined() && keys_.device() != Device::CPU; }
  bool graph_prepare() override;
  std::optional<DirectRow> graph_append(const Tensor& like) override;
  bool can_fork(int64_t tokens) const override { return kv_fork_copies() && tokens >= 0 && tokens <= offset_; }
  std::unique_ptr<LayerCache> fork(int64_t tokens) const override;  // a copy of the first `tokens` rows

 private:
  void reserve(int64_t tokens, const Tensor& like_k, const Tensor& like_v);
  KVView view() const;
  Tensor keys_, values_;  // [capacity, Hkv, D]
  int64_t offset_ = 0;
};

// Ring buffer of the last max_size tokens for sliding-window layers.
class RotatingKVCache : public LayerCache {
 public:
  // cpu_store: the type K/V rows take when they live on the CPU (F32 or BF16; devices keep their own).
  explicit RotatingKVCache(int64_t max_size, DType cpu_store = DType::F32)
      : max_size_(max_size), cpu_store_(cpu_store) {}
  const char* kind() const override { return "rotating"; }
  int64_t offset() const override { return offset_; }
  int64_t max_size() const { return max_size_; }
  KVView update(const Tensor& k, const Tensor& v) override;
  CacheState state() const override;
  void restore(const CacheState& s) override;
  // Only before the ring has dropped anything (then slot i still holds position i); dropping nothing always.
  bool can_trim(int64_t n) const override {
    return n == 0 || (n > 0 && n <= offset_ && offset_ <= max_size_ && idx_ == filled_ % max_size_);
  }
  int64_t trim(int64_t n) override;
  size_t bytes() const override;
  // A copy of the ring, trimmed: at its own length always, shorter only while trimming could reach it.
  bool can_fork(int64_t tokens) const override {
    return kv_fork_copies() && tokens >= 0 && tokens <= offset_ && can_trim(offset_ - tokens);
  }
  std::unique_ptr<LayerCache> fork(int64_t tokens) const override;

 private:
  Tensor ordered(const Tensor& ring) const;  // ring contents oldest-first
  Tensor keys_, values_;                     // [max_size, Hkv, D]
  int64_t max_size_;
  DType cpu_store_;
  int64_t offset_ = 0;  // tokens seen
  int64_t filled_ = 0;  // slots holding tokens (≤ max_size)
  int64_t idx_ = 0;     // next slot to write
};

}  // namespace lathe
