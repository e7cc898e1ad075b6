// KV caches that store keys and values as MLX affine triples (packed U32 codes + scales/biases per group of
// head_dim values, in the activations' dtype as MLX does: f32 on the CPU), quantized as tokens arrive;
// attention reads the triples (KVView::quantized).
// Storage per token and head: D·bits/8 bytes of codes + 2·(D/group)·4 bytes of scales and biases, for K and V.
// A head narrower than the group size is quantized as one group.
#pragma once
#include <memory>
#include <optional>

#include "cache/kv_block_pool.h"
#include "cache/layer_cache.h"
#include "cache/row_tensors.h"

namespace lathe {

// Growing quantized cache for full-attention layers (mlx-lm QuantizedKVCache). On the CPU its rows live in
// blocks of the KV pool (kv_block_pool.h), so caches fork and share a prefix copy-on-write like PagedKVCache.
class QuantizedKVCache : public LayerCache {
 public:
  QuantizedKVCache(int bits, int group_size);
  ~QuantizedKVCache() override;
  const char* kind() const override { return "quantized"; }
  int64_t offset() const override { return offset_; }
  int bits() const { return bits_; }
  int group_size() const { return group_size_; }
  KVView update(const Tensor& k, const Tensor& v) override;
  CacheState state() const override;
  void restore(const CacheState& s) override;
  bool can_trim(int64_t n) const override { return n >= 0 && n <= offset_; }
  int64_t trim(int64_t n) override;
  size_t bytes() const override;
  // Paged rows share blocks; contiguous ones (on a device) are copied.
  bool can_fork(int64_t tokens) const override {
    return (paged_ || kv_fork_copies()) && tokens >= 0 && tokens <= offset_;
  }
  std::unique_ptr<LayerCache> fork(int64_t tokens) const override;
  bool paged() const { return paged_ != nullptr; }
  // k/v [T, Hkv, D] quantized as update() stores them: the six row tensors [T, Hkv, ...].
  RowTensors quantize(const Tensor& k, const Tensor& v) const;
  // A batched device decode step (model/layers/attention.cc) writes many caches' next rows with one launch:
  // next_row() makes room for one more token and says where its six parts go; nullopt where the rows are paged
  // (CPU) or no rows have arrived yet. commit_row() then counts that token, as update().
  std::optional<QuantizedRowDest> next_row();
  KVView commit_row();
  // Batched decode graphs (model/batch_graph.h): contiguous device rows only.
  bool graph_appendable() const override;
  bool graph_prepare() override;
  std::optional<QuantizedRowDest> graph_append_quantized() override;
  const PagedRows* paged_rows() const { return paged_.get(); }  // tests, statistics

 private:
  void append(const RowTensors& rows);              // rows [T, Hkv, ...] x 6 after the offset
  void grow(const RowTensors& like, int64_t rows);  // contiguous storage for at least `rows` rows
  int bits_, group_size_;
  RowTensors buf_;                    // k codes, k scales, k biases, v codes, v scales, v biases; [capacity, Hkv, ...]
  std::unique_ptr<PagedRows> paged_;  // buf_'s blocks on the CPU (null: buf_ is contiguous)
  bool decided_ = false;              // whether the first rows chose paged or contiguous storage
  int64_t offset_ = 0;
};

// Ring buffer of the last max_size tokens, quantized (sliding-window layers); the ring mechanics match
// RotatingKVCache, applied to the triples.
class RotatingQuantizedKVCache : public LayerCache {
 public:
  RotatingQuantizedKVCache(int64_t max_size, int bits, int group_size);
  const char* kind() const override { return "rotating_quantized"; }
  int64_t offset() const override { return offset_; }
  int64_t max_size() const { return max_size_; }
  KVView update(const Tensor& k, const Tensor& v) override;
  CacheState state() const override;
  void restore(const CacheState& s) override;
  bool can_trim(int64_t n) const override {
    return n == 0 || (n > 0 && n <= offset_ && offset_ <= max_size_ && idx_ == filled_ % max_size_);
  }
  int64_t trim(int64_t n) override;
  size_t bytes() const override { return ring_.nbytes(); }
  bool can_fork(int64_t tokens) const override {  // as RotatingKVCache: a trimmed copy of the ring
    return kv_fork_copies() && tokens >= 0 && tokens <= offset_ && can_trim(offset_ - tokens);
  }
  std::unique_ptr<LayerCache> fork(int64_t tokens) const override;

 private:
  RowTensors ordered() const;  // ring contents oldest-first
  int bits_, group_size_;
  int64_t max_size_;
  RowTensors ring_;  // [max_size, Hkv, ...] x 6
  int64_t offset_ = 0, filled_ = 0, idx_ = 0;
};

}  // namespace lathe
