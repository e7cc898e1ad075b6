#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "cache/kv_block_pool.h"
#include "cache/layer_cache.h"
#include "common/env.h"
#include "common/error.h"
#include "tensor/device_memory.h"
#include "tensor/ops.h"

namespace lathe {
namespace {

const Tensor& find_tensor(const CacheState& s, const char* name) {
  for (const auto& [n, t] : s.tensors)
    if (n == name) return t;
  throw Error(ErrorKind::Corrupt, std::string("cache state of kind '") + s.kind + "' lacks tensor '" + name + "'");
}

int64_t find_meta(const CacheState& s, const char* name) {
  auto it = s.meta.find(name);
  if (it == s.meta.end())
    throw Error(ErrorKind::Corrupt, std::string("cache state of kind '") + s.kind + "' lacks '" + name + "'");
  return it->second;
}
// A full-attention cache's state (kind "kv"): its live rows and offset. KVCache and PagedKVCache share it, so a
// KV file does not know which of them wrote it.
CacheState kv_rows_state(const char* kind, const Tensor& keys, const Tensor& values, int64_t offset) {
  CacheState s;
  s.kind = kind;
  if (offset > 0) {
    s.tensors.emplace_back("keys", keys.slice(0, 0, offset).clone());
    s.tensors.emplace_back("values", values.slice(0, 0, offset).clone());
  }
  s.meta["offset"] = offset;
  return s;
}

// The rows a "kv" state holds (null when it holds none), checked against its offset.
std::optional<std::pair<const Tensor*, const Tensor*>> kv_state_rows(const CacheState& s, const char* kind) {
  if (s.kind != kind)
    throw Error(ErrorKind::InvalidArgument, "cannot restore a '" + s.kind + "' state into a kv cache");
  const int64_t off = find_meta(s, "offset");
  if (off == 0) return std::nullopt;
  const Tensor& k = find_tensor(s, "keys");
  const Tensor& v = find_tensor(s, "values");
  if (k.dim(0) != off || v.dim(0) != off)
    throw Error(ErrorKind::Corrupt, "kv cache state: offset " + std::to_string(off) + " but keys " + k.describe());
  return std::make_pair(&k, &v);
}

}  // namespace

Tensor kv_rows_as(const Tensor& x, DType cpu_store) {
  if (x.device() != Device::CPU || x.dtype() == cpu_store) return x;
  return x.contiguous().to(cpu_store);
}

bool kv_fork_copies() {
  static const bool on = env_switch("LATHE_KV_FORK_COPY");
  return on;
}

KVView LayerCache::commit_direct_rows(int64_t n) {
  (void)n;
  throw Error(ErrorKind::Internal,
              std::string("commit_direct_rows on a '") + kind() + "' cache, which takes no direct rows");
}

int64_t kv_row_bytes(const Tensor& rows) {
  int64_t b = static_cast<int64_t>(dtype_size(rows.dtype()));
  for (size_t d = 1; d < rows.shape().size(); ++d) b *= rows.dim(static_cast<int>(d));
  return b;
}

int64_t kv_grow_capacity(int64_t tokens, const std::vector<int64_t>& row_bytes, Device device) {
  const int64_t cap = (tokens + kKvGrowStep - 1) / kKvGrowStep * kKvGrowStep;
  if (device != Device::CUDA) return cap;
  int64_t held = INT64_MAX;  // the rows every buffer's allocation holds
  for (int64_t b : row_bytes)
    if (b > 0) held = std::min(held, static_cast<int64_t>(device_alloc_size(static_cast<size_t>(cap * b))) / b);
  return held == INT64_MAX ? cap : std::max(cap, held);
}

void KVCache::reserve(int64_t tokens, const Tensor& like_k, const Tensor& like_v) {
  if (keys_.defined() && keys_.dim(0) >= tokens) return;
  const int64_t cap = kv_grow_capacity(tokens, {kv_row_bytes(like_k), kv_row_bytes(like_v)}, like_k.device());
  Tensor nk = Tensor::empty({cap, like_k.dim(1), like_k.dim(2)}, like_k.dtype(), like_k.device());
  Tensor nv = Tensor::empty({cap, like_v.dim(1), like_v.dim(2)}, like_v.dtype(), like_v.device());
  if (offset_ > 0) {
    copy_rows(nk, 0, keys_.slice(0, 0, offset_), 0, offset_);
    copy_rows(nv, 0, values_.slice(0, 0, offset_), 0, offset_);
  }
  keys_ = nk;
  values_ = nv;
}

KVView KVCache::update(const Tensor& k, const Tensor& v) {
  const int64_t T = k.dim(0);
  reserve(offset_ + T, k, v);
  copy_rows(keys_, offset_, k, 0, T);
  copy_rows(values_, offset_, v, 0, T);
  offset_ += T;
  return view();
}

KVView KVCache::view() const {
  KVView v;
  v.k = keys_.slice(0, 0, offset_);
  v.v = values_.slice(0, 0, offset_);
  v.pos0 = 0;
  return v;
}

std::optional<DirectRow> KVCache::direct_rows(const Tensor& like, int64_t n) {
  if (n < 1) return std::nullopt;
  reserve(offset_ + n, like, like);
  return DirectRow{&keys_, &values_, offset_};
}

KVView KVCache::commit_direct_rows(int64_t n) {
  LATHE_CHECK(n >= 1 && keys_.defined() && offset_ + n <= keys_.dim(0), "commit_direct_rows: rows not reserved");
  offset_ += n;
  return view();
}

bool KVCache::graph_prepare() {
  if (!graph_appendable()) return false;
  reserve(offset_ + 1, keys_, values_);
  return true;
}

std::optional<DirectRow> KVCache::graph_append(const Tensor& like) {
  if (like.device() == Device::CPU) return std::nullopt;
  reserve(offset_ + 1, like, like);
  return DirectRow{&keys_, &values_, offset_++};
}

std::unique_ptr<LayerCache> KVCache::fork(int64_t tokens) const {
  if (!can_fork(tokens)) return nullptr;
  auto out = std::make_unique<KVCache>();
  if (tokens > 0) {
    out->reserve(tokens, keys_, values_);
    copy_rows(out->keys_, 0, keys_, 0, tokens);
    copy_rows(out->values_, 0, values_, 0, tokens);
    out->offset_ = tokens;
  }
  return out;
}

CacheState KVCache::state() const { return kv_rows_state(kind(), keys_, values_, offset_); }

void KVCache::restore(const CacheState& s) {
  const auto rows = kv_state_rows(s, kind());
  keys_ = Tensor();
  values_ = Tensor();
  offset_ = 0;
  if (rows) update(*rows->first, *rows->second);
}

int64_t KVCache::trim(int64_t n) {
  n = std::min(std::max<int64_t>(n, 0), offset_);
  offset_ -= n;
  return n;
}

const void* KVCache::replay_buffer() const {
  if (!keys_.defined() || keys_.device() == Device::CPU || offset_ + 1 > keys_.dim(0)) return nullptr;
  return keys_.raw();
}

size_t KVCache::bytes() const { return keys_.defined() ? keys_.nbytes() + values_.nbytes() : 0; }

// ---- RotatingKVCache ----

Tensor RotatingKVCache::ordered(const Tensor& ring) const {
  if (filled_ < max_size_ || idx_ == 0) return ring.slice(0, 0, filled_).contiguous();
  Tensor out = Tensor::empty({filled_, ring.dim(1), ring.dim(2)}, ring.dtype(), ring.device());
  copy_rows(out, 0, ring, idx_, max_size_ - idx_);
  copy_rows(out, max_size_ - idx_, ring, 0, idx_);
  return out;
}

KVView RotatingKVCache::update(const Tensor& k_in, const Tensor& v_in) {
  const Tensor k = kv_rows_as(k_in, cpu_store_), v = kv_rows_as(v_in, cpu_store_);
  const int64_t T = k.dim(0);
  if (!keys_.defined()) {
    keys_ = Tensor::empty({max_size_, k.dim(1), k.dim(2)}, k.dtype(), k.device());
    values_ = Tensor::empty({max_size_, v.dim(1), v.dim(2)}, v.dtype(), v.device());
  }
  KVView view;
  if (T == 1) {  // decode: write one slot, attend over the ring in place with explicit positions
    copy_rows(keys_, idx_, k, 0, 1);
    copy_rows(values_, idx_, v, 0, 1);
    const int64_t newest_slot = idx_;
    filled_ = std::min(filled_ + 1, max_size_);
    idx_ = (idx_ + 1) % max_size_;
    ++offset_;
    view.k = keys_.slice(0, 0, filled_);
    view.v = values_.slice(0, 0, filled_);
    view.positions.resize(static_cast<size_t>(filled_));
    for (int64_t s = 0; s < filled_; ++s) {
      const int64_t age = (newest_slot - s + max_size_) % max_size_;
      view.positions[static_cast<size_t>(s)] = offset_ - 1 - age;
    }
    return view;
  }
  // Prefill: attention sees the retained history plus all new tokens, in order; then keep the last max_size.
  const Tensor prev_k = ordered(keys_), prev_v = ordered(values_);
  const int64_t P = filled_, total = P + T;
  Tensor all_k = Tensor::empty({total, k.dim(1), k.dim(2)}, k.dtype(), k.device());
  Tensor all_v = Tensor::empty({total, v.dim(1), v.dim(2)}, v.dtype(), v.device());
  copy_rows(all_k, 0, prev_k, 0, P);
  copy_rows(all_v, 0, prev_v, 0, P);
  copy_rows(all_k, P, k, 0, T);
  copy_rows(all_v, P, v, 0, T);
  view.k = all_k;
  view.v = all_v;
  view.pos0 = offset_ - P;
  const int64_t keep = std::min(total, max_size_);
  copy_rows(keys_, 0, all_k, total - keep, keep);
  copy_rows(values_, 0, all_v, total - keep, keep);
  filled_ = keep;
  idx_ = keep % max_size_;
  offset_ += T;
  return view;
}

CacheState RotatingKVCache::state() const {
  CacheState s;
  s.kind = kind();
  if (filled_ > 0) {
    s.tensors.emplace_back("keys", keys_.slice(0, 0, filled_).clone());
    s.tensors.emplace_back("values", values_.slice(0, 0, filled_).clone());
  }
  s.meta["offset"] = offset_;
  s.meta["idx"] = idx_;
  s.meta["max_size"] = max_size_;
  s.meta["keep"] = 0;
  return s;
}

void RotatingKVCache::restore(const CacheState& s) {
  if (s.kind != kind())
    throw Error(ErrorKind::InvalidArgument, "cannot restore a '" + s.kind + "' state into a rotating cache");
  const int64_t max_size = find_meta(s, "max_size");
  if (max_size != max_size_)
    throw Error(ErrorKind::InvalidArgument, "rotating cache state has max_size " + std::to_string(max_size) +
                                                ", this layer's window is " + std::to_string(max_size_));
  offset_ = find_meta(s, "offset");
  idx_ = find_meta(s, "idx");
  filled_ = std::min(offset_, max_size_);
  keys_ = Tensor();
  values_ = Tensor();
  if (filled_ == 0) return;
  const Tensor k = kv_rows_as(find_tensor(s, "keys"), cpu_store_);  // a file from either type restores
  const Tensor v = kv_rows_as(find_tensor(s, "values"), cpu_store_);
  if (k.dim(0) != filled_ || v.dim(0) != filled_ || idx_ < 0 || idx_ >= max_size_)
    throw Error(ErrorKind::Corrupt, "rotating cache state is inconsistent (offset " + std::to_string(offset_) +
                                        ", idx " + std::to_string(idx_) + ", keys " + k.describe() + ")");
  keys_ = Tensor::empty({max_size_, k.dim(1), k.dim(2)}, k.dtype(), k.device());
  values_ = Tensor::empty({max_size_, v.dim(1), v.dim(2)}, v.dtype(), v.device());
  copy_rows(keys_, 0, k, 0, filled_);
  copy_rows(values_, 0, v, 0, filled_);
}

int64_t RotatingKVCache::trim(int64_t n) {
  if (n == 0 || !can_trim(n)) return 0;
  offset_ -= n;
  filled_ -= n;
  idx_ = filled_ % max_size_;
  return n;
}

std::unique_ptr<LayerCache> RotatingKVCache::fork(int64_t tokens) const {
  if (!can_fork(tokens)) return nullptr;
  auto out = std::make_unique<RotatingKVCache>(max_size_, cpu_store_);
  if (keys_.defined()) {
    out->keys_ = keys_.clone();
    out->values_ = values_.clone();
  }
  out->offset_ = offset_;
  out->filled_ = filled_;
  out->idx_ = idx_;
  out->trim(offset_ - tokens);
  return out;
}

size_t RotatingKVCache::bytes() const { return keys_.defined() ? keys_.nbytes() + values_.nbytes() : 0; }

// ---- PagedKVCache (kv_block_pool.h) ----

PagedKVCache::~PagedKVCache() = default;

bool PagedKVCache::decide(const Tensor& k, const Tensor& v) {
  if (rows_) return true;
  if (dense_) return false;
  if (k.ndim() == 3 && v.ndim() == 3) rows_ = PagedRows::create(RowTensors{{k, v}});
  if (!rows_) dense_ = std::make_unique<KVCache>();
  return rows_ != nullptr;
}

int64_t PagedKVCache::offset() const { return dense_ ? dense_->offset() : offset_; }

KVView PagedKVCache::view() const {
  KVView v;
  v.k = rows_->rows().parts[0].slice(0, 0, offset_);
  v.v = rows_->rows().parts[1].slice(0, 0, offset_);
  v.pos0 = 0;
  return v;
}

KVView PagedKVCache::update(const Tensor& k_in, const Tensor& v_in) {
  // On the CPU rows take the cache's type here (restored states too, whichever type their file holds). F32
  // rows bound for BF16 blocks are rounded by copy_rows as it writes them (one pass, over the pool's threads,
  // instead of a serial conversion and a copy); decide() then sees one row of the stored type.
  const bool convert_in_copy = k_in.device() == Device::CPU && cpu_store_ == DType::BF16 &&
                               k_in.dtype() == DType::F32 && v_in.dtype() == DType::F32 && k_in.ndim() == 3 &&
                               v_in.ndim() == 3 && !dense_;
  const Tensor k = convert_in_copy ? k_in : kv_rows_as(k_in, cpu_store_);
  const Tensor v = convert_in_copy ? v_in : kv_rows_as(v_in, cpu_store_);
  const bool paged = convert_in_copy && !rows_ ? decide(Tensor::empty({1, k.dim(1), k.dim(2)}, cpu_store_),
                                                        Tensor::empty({1, v.dim(1), v.dim(2)}, cpu_store_))
                                               : decide(k, v);
  if (!paged) return dense_->update(kv_rows_as(k, cpu_store_), kv_rows_as(v, cpu_store_));
  const int64_t T = k.dim(0);
  rows_->make_room(offset_, offset_ + T);
  Tensor keys = rows_->rows().parts[0], values = rows_->rows().parts[1];  // handles onto the mapped rows
  copy_rows(keys, offset_, k, 0, T);
  copy_rows(values, offset_, v, 0, T);
  offset_ += T;
  return view();
}

CacheState PagedKVCache::state() const {
  if (dense_) return dense_->state();
  if (!rows_) return kv_rows_state(kind(), Tensor(), Tensor(), 0);
  return kv_rows_state(kind(), rows_->rows().parts[0], rows_->rows().parts[1], offset_);
}

void PagedKVCache::restore(const CacheState& s) {
  const auto rows = kv_state_rows(s, kind());
  dense_.reset();
  rows_.reset();
  offset_ = 0;
  if (rows) update(*rows->first, *rows->second);
}

int64_t PagedKVCache::trim(int64_t n) {
  if (dense_) return dense_->trim(n);
  n = std::min(std::max<int64_t>(n, 0), offset_);
  offset_ -= n;
  if (rows_) rows_->keep(offset_);
  return n;
}

size_t PagedKVCache::bytes() const {
  if (dense_) return dense_->bytes();
  return rows_ ? rows_->bytes() : 0;
}

const void* PagedKVCache::replay_buffer() const { return dense_ ? dense_->replay_buffer() : nullptr; }

void PagedKVCache::replay_append() {
  if (dense_) dense_->replay_append();
}

std::optional<DirectRow> PagedKVCache::graph_append(const Tensor& like) {
  if (rows_ || like.device() == Device::CPU) return std::nullopt;
  if (!dense_) dense_ = std::make_unique<KVCache>();
  return dense_->graph_append(like);
}

std::optional<DirectRow> PagedKVCache::direct_rows(const Tensor& like, int64_t n) {
  // The CPU writes through update() (which sees K and V and picks the blocks); a device cache is contiguous.
  if (rows_ || (!dense_ && like.device() == Device::CPU)) return std::nullopt;
  if (!dense_) dense_ = std::make_unique<KVCache>();
  return dense_->direct_rows(like, n);
}

KVView PagedKVCache::commit_direct_rows(int64_t n) {
  if (dense_) return dense_->commit_direct_rows(n);
  return LayerCache::commit_direct_rows(n);
}

std::unique_ptr<LayerCache> PagedKVCache::fork(int64_t tokens) const {
  if (!can_fork(tokens)) return nullptr;
  auto out = std::make_unique<PagedKVCache>(cpu_store_);
  if (dense_) {
    out->dense_.reset(static_cast<KVCache*>(dense_->fork(tokens).release()));
  } else if (rows_) {
    out->rows_ = rows_->fork(tokens);
    out->offset_ = tokens;
  }
  return out;
}

const std::vector<int64_t>& PagedKVCache::key_blocks() const {
  static const std::vector<int64_t> none;
  return rows_ ? rows_->blocks(0) : none;
}
const std::vector<int64_t>& PagedKVCache::value_blocks() const {
  static const std::vector<int64_t> none;
  return rows_ ? rows_->blocks(1) : none;
}
const KvBlockPool* PagedKVCache::key_pool() const { return rows_ ? rows_->pool(0) : nullptr; }
const KvBlockPool* PagedKVCache::value_pool() const { return rows_ ? rows_->pool(1) : nullptr; }

bool can_fork_cache_list(const CacheList& caches, int64_t tokens) {
  for (const auto& c : caches)
    if (!c || !c->can_fork(tokens)) return false;
  return true;
}

std::optional<CacheList> fork_cache_list(const CacheList& caches, int64_t tokens) {
  if (!can_fork_cache_list(caches, tokens)) return std::nullopt;
  CacheList out;
  for (const auto& c : caches) out.push_back(c->fork(tokens));
  return out;
}

}  // namespace lathe
