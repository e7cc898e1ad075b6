// Paged KV memory on the CPU, shared copy-on-write between sequences (the prompt cache's RAM tier).
//
// A KvBlockPool hands out fixed-size blocks of one shared-memory file (memfd), each with a reference count.
// PagedRows keeps a cache's row tensors (keys and values, or the six parts of quantized K/V) in such blocks of
// block_tokens() tokens, mapped in token order into one reserved virtual range per tensor, so attention reads
// them as contiguous [tokens, ...] tensors and no kernel knows about blocks. fork(n) maps the blocks holding the
// first n tokens into new rows (each block's count + 1): sequences that share a prefix — a kept finished
// sequence and every request extending it, or a running row and a later request with the same system prompt —
// hold it once. A write into a block that another cache still maps first copies it into a fresh block
// (copy-on-write); a block goes back to the pool (its pages punched out of the file) when the last cache mapping
// it lets go.
//
// PagedKVCache (kind "kv") and QuantizedKVCache (kind "quantized") page their rows this way on the CPU. On other
// devices (and for rows whose blocks cannot be whole pages) they stay contiguous: the same state and kind, the
// same CUDA decode paths; fork() then copies the prefix's rows.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <vector>

#include "cache/layer_cache.h"
#include "cache/row_tensors.h"

namespace lathe {

// The shortest block (K and V); caches with more row tensors, or rows too narrow for whole pages, take multiples.
inline constexpr int64_t kKvBlockTokens = 256;
inline constexpr int64_t kKvBlockTokensMax = 65536;  // the longest a budget makes them

// Each mapped block is one kernel VMA, and a process may hold vm.max_map_count of them (65,530 by default). Once
// the KV budget is known (set_kv_pool_budget, by the server), blocks are made long enough that the budget filled
// with caches of one row shape maps at most half that limit: tiny K/V rows and large budgets take longer blocks.
void set_kv_pool_budget(int64_t bytes);  // 0: no budget known (blocks as short as the parts allow)
int64_t kv_pool_budget();
int64_t vm_map_limit();  // /proc/sys/vm/max_map_count (65,530 where it cannot be read)
// The shortest block (a power-of-two multiple of kKvBlockTokens, at most kKvBlockTokensMax) for which
// `budget_bytes` of rows of `row_bytes` bytes a token, kept in `parts` tensors, maps at most map_limit / 2 blocks.
int64_t kv_block_tokens_for(int64_t budget_bytes, int64_t row_bytes, int64_t parts, int64_t map_limit);

// Blocks in use over every pool of the process: `bytes` their size (a shared block counted once), `references`
// the blocks as the caches see them (a block mapped by three caches counts three), `resident` the memory the
// pools' files really hold — a block's pages exist once written and a copy-on-write copies only the rows in use,
// so it is at most `bytes`.
struct KvPoolStats {
  int64_t blocks = 0, bytes = 0, references = 0, resident = 0;
};
KvPoolStats kv_pool_stats();

class KvBlockPool {
 public:
  // The process-wide pool of blocks of this many bytes (a multiple of the page size); created on first use.
  static KvBlockPool& for_block_bytes(size_t block_bytes);
  KvBlockPool(const KvBlockPool&) = delete;
  KvBlockPool& operator=(const KvBlockPool&) = delete;

  size_t block_bytes() const { return block_bytes_; }
  int fd() const { return fd_; }
  int64_t allocate();  // a block with count 1
  void retain(int64_t block);
  void release(int64_t block);  // at 0 the block is free and its pages are handed back
  int refcount(int64_t block) const;
  KvPoolStats stats() const;

 private:
  explicit KvBlockPool(size_t block_bytes);
  mutable std::mutex mu_;
  size_t block_bytes_;
  int fd_ = -1;
  std::vector<int> refs_;   // per block of the file
  std::set<int64_t> free_;  // lowest first, so the file stays compact
  int64_t used_ = 0, references_ = 0;
};

// One tensor's blocks mapped in order into a reserved virtual range [capacity tokens, row].
struct KvPagedRange;

// Row tensors [capacity, ...] (one row per token) in pool blocks that every part cuts at the same tokens.
class PagedRows {
 public:
  // Paged storage for rows shaped like `like`'s parts (their first dimension aside), or null when a part is
  // not on the CPU or no block of its rows up to 16 times the shortest allowed is whole pages. Blocks hold
  // 256 tokens for two parts (K and V), longer ones for more parts (quantized K/V: 1,024) and where the KV
  // budget calls for it (set_kv_pool_budget).
  static std::unique_ptr<PagedRows> create(const RowTensors& like);
  ~PagedRows();
  PagedRows(const PagedRows&) = delete;
  PagedRows& operator=(const PagedRows&) = delete;

  // Aliases of the mapped ranges [capacity, ...]; a view taken of them keeps its blocks alive. make_room may
  // replace them (a larger reservation mapping the same blocks), so read them again after it.
  const RowTensors& rows() const { return rows_; }
  int64_t block_tokens() const { return block_tokens_; }
  // Rows [begin, end) writable by these rows alone: fresh blocks past the mapped ones, copies of shared ones.
  void make_room(int64_t begin, int64_t end);
  void keep(int64_t tokens);  // gives back the blocks past the first `tokens` tokens
  // Rows whose first `tokens` tokens map these rows' blocks (each count + 1).
  std::unique_ptr<PagedRows> fork(int64_t tokens) const;
  size_t bytes() const;  // the blocks mapped (shared ones included)
  const std::vector<int64_t>& blocks(size_t part) const;
  const KvBlockPool* pool(size_t part) const;

 private:
  PagedRows() = default;
  void alias();  // rows_ from ranges_
  std::vector<std::shared_ptr<KvPagedRange>> ranges_;
  RowTensors rows_;
  int64_t block_tokens_ = kKvBlockTokens;
};

class PagedKVCache : public LayerCache {
 public:
  // cpu_store: the type K/V rows take on the CPU (F32 or BF16); a device cache keeps the activations' type.
  explicit PagedKVCache(DType cpu_store = DType::F32) : cpu_store_(cpu_store) {}
  ~PagedKVCache() override;
  const char* kind() const override { return "kv"; }
  int64_t offset() const override;
  KVView update(const Tensor& k, const Tensor& v) override;
  CacheState state() const override;
  void restore(const CacheState& s) override;
  bool can_trim(int64_t n) const override { return n >= 0 && n <= offset(); }
  int64_t trim(int64_t n) override;
  size_t bytes() const override;  // the blocks this cache maps (shared ones included)
  const void* replay_buffer() const override;
  void replay_append() override;
  std::optional<DirectRow> direct_rows(const Tensor& like, int64_t n) override;
  KVView commit_direct_rows(int64_t n) override;
  bool graph_appendable() const override { return !rows_ && dense_ && dense_->graph_appendable(); }
  bool graph_prepare() override { return !rows_ && dense_ && dense_->graph_prepare(); }
  std::optional<DirectRow> graph_append(const Tensor& like) override;
  // A cache of this one's first `tokens` tokens: sharing their blocks when paged(), else a copy of the rows.
  bool can_fork(int64_t tokens) const override {
    return (rows_ || kv_fork_copies()) && tokens >= 0 && tokens <= offset();
  }
  std::unique_ptr<LayerCache> fork(int64_t tokens) const override;

  bool paged() const { return rows_ != nullptr; }
  int64_t block_tokens() const { return rows_ ? rows_->block_tokens() : 0; }
  // Block ids of the keys / values in token order and the pools they come from (tests, statistics).
  const std::vector<int64_t>& key_blocks() const;
  const std::vector<int64_t>& value_blocks() const;
  const KvBlockPool* key_pool() const;
  const KvBlockPool* value_pool() const;

 private:
  bool decide(const Tensor& k, const Tensor& v);  // on first use: paged (CPU) or dense; true when paged
  KVView view() const;
  std::unique_ptr<KVCache> dense_;
  std::unique_ptr<PagedRows> rows_;  // keys, values
  int64_t offset_ = 0;
  DType cpu_store_;
};

// Whether every cache of a list can fork at `tokens` (paged, holding at least that many)...
bool can_fork_cache_list(const CacheList& caches, int64_t tokens);
// ...and then forks of them all at `tokens` (else nullopt).
std::optional<CacheList> fork_cache_list(const CacheList& caches, int64_t tokens);

}  // namespace lathe
