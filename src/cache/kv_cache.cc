#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include "cache/kv_block_pool.h"
#include "cache/layer_cache.h"
#include "common/error.h"
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

KVView LayerCache::commit_direct() {
  throw Error(ErrorKind::Internal,
              std::string("commit_direct on a '") + kind() + "' cache, which takes no direct rows");
}

void KVCache::reserve(int64_t tokens, const Tensor& like_k, const Tensor& like_v) {
  if (keys_.defined() && keys_.dim(0) >= tokens) return;
  const int64_t cap = (tokens + kKvGrowStep - 1) / kKvGrowStep * kKvGrowStep;
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

std::optional<DirectRow> KVCache::direct_row(const Tensor& like) {
  reserve(offset_ + 1, like, like);
  return DirectRow{&keys_, &values_, offset_};
}

KVView KVCache::commit_direct() {
  ++offset_;
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
  if (!can_trim(n)) return 0;
  offset_ -= n;
  filled_ -= n;
  idx_ = filled_ % max_size_;
  return n;
}

size_t RotatingKVCache::bytes() const { return keys_.defined() ? keys_.nbytes() + values_.nbytes() : 0; }

// ---- KvBlockPool and PagedKVCache (kv_block_pool.h) ----

namespace {

size_t kv_page_bytes() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

std::mutex& kv_pools_mutex() {
  static std::mutex m;
  return m;
}
// Never destroyed: caches may outlive static destruction order (a writer thread's last reference).
std::map<size_t, KvBlockPool*>& kv_pools() {
  static auto* pools = new std::map<size_t, KvBlockPool*>();
  return *pools;
}

[[noreturn]] void kv_pool_fail(const std::string& what) {
  throw Error(ErrorKind::Io, "KV block pool: " + what + ": " + std::strerror(errno));
}

}  // namespace

KvBlockPool& KvBlockPool::for_block_bytes(size_t block_bytes) {
  const std::lock_guard<std::mutex> lock(kv_pools_mutex());
  KvBlockPool*& p = kv_pools()[block_bytes];
  if (!p) p = new KvBlockPool(block_bytes);
  return *p;
}

KvBlockPool::KvBlockPool(size_t block_bytes) : block_bytes_(block_bytes) {
  if (block_bytes == 0 || block_bytes % kv_page_bytes() != 0)
    throw Error(ErrorKind::Internal,
                "KV block pool: blocks of " + std::to_string(block_bytes) + " bytes are not whole pages");
  fd_ = memfd_create("lathe-kv-blocks", MFD_CLOEXEC);
  if (fd_ < 0) kv_pool_fail("memfd_create");
}

int64_t KvBlockPool::allocate() {
  const std::lock_guard<std::mutex> lock(mu_);
  if (free_.empty()) {  // the file grows sparsely: pages exist only once a block is written
    const int64_t old = static_cast<int64_t>(refs_.size());
    const int64_t grown = std::max<int64_t>(64, old * 2);
    if (ftruncate(fd_, static_cast<off_t>(grown * static_cast<int64_t>(block_bytes_))) != 0) kv_pool_fail("ftruncate");
    refs_.resize(static_cast<size_t>(grown), 0);
    for (int64_t b = old; b < grown; ++b) free_.insert(b);
  }
  const int64_t b = *free_.begin();
  free_.erase(free_.begin());
  refs_[static_cast<size_t>(b)] = 1;
  ++used_;
  ++references_;
  return b;
}

void KvBlockPool::retain(int64_t block) {
  const std::lock_guard<std::mutex> lock(mu_);
  ++refs_.at(static_cast<size_t>(block));
  ++references_;
}

void KvBlockPool::release(int64_t block) {
  const std::lock_guard<std::mutex> lock(mu_);
  int& r = refs_.at(static_cast<size_t>(block));
  if (r <= 0) return;
  --references_;
  if (--r > 0) return;
  --used_;
  free_.insert(block);
  // Hand the pages back (a failure only keeps them resident until the block is reused).
  (void)fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                  static_cast<off_t>(block * static_cast<int64_t>(block_bytes_)), static_cast<off_t>(block_bytes_));
}

int KvBlockPool::refcount(int64_t block) const {
  const std::lock_guard<std::mutex> lock(mu_);
  return block >= 0 && static_cast<size_t>(block) < refs_.size() ? refs_[static_cast<size_t>(block)] : 0;
}

KvPoolStats KvBlockPool::stats() const {
  const std::lock_guard<std::mutex> lock(mu_);
  KvPoolStats s;
  s.blocks = used_;
  s.bytes = used_ * static_cast<int64_t>(block_bytes_);
  s.references = references_;
  return s;
}

KvPoolStats kv_pool_stats() {
  std::vector<KvBlockPool*> pools;
  {
    const std::lock_guard<std::mutex> lock(kv_pools_mutex());
    for (const auto& [bytes, p] : kv_pools()) pools.push_back(p);
  }
  KvPoolStats total;
  for (const KvBlockPool* p : pools) {
    const KvPoolStats s = p->stats();
    total.blocks += s.blocks;
    total.bytes += s.bytes;
    total.references += s.references;
  }
  return total;
}

struct KvPagedRange {
  KvBlockPool* pool = nullptr;
  char* base = nullptr;
  int64_t capacity = 0;  // tokens the reservation holds (whole blocks)
  Shape row;             // [Hkv, D]
  DType dtype = DType::F32;
  size_t row_bytes = 0;
  std::vector<int64_t> blocks;  // block i holds tokens [i·kKvBlockTokens, (i+1)·kKvBlockTokens)

  KvPagedRange(KvBlockPool& p, const Shape& row_shape, DType type, int64_t tokens)
      : pool(&p), row(row_shape), dtype(type) {
    row_bytes = static_cast<size_t>(shape_numel(row)) * dtype_size(dtype);
    capacity = std::max<int64_t>(1, (tokens + kKvBlockTokens - 1) / kKvBlockTokens) * kKvBlockTokens;
    void* at = mmap(nullptr, reserved(), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (at == MAP_FAILED) kv_pool_fail("reserving " + std::to_string(reserved()) + " bytes of address space");
    base = static_cast<char*>(at);
  }
  ~KvPagedRange() {
    munmap(base, reserved());
    for (int64_t b : blocks) pool->release(b);
  }
  KvPagedRange(const KvPagedRange&) = delete;
  KvPagedRange& operator=(const KvPagedRange&) = delete;

  size_t reserved() const { return static_cast<size_t>(capacity) * row_bytes; }
  char* slot(size_t i) const { return base + i * pool->block_bytes(); }
  void map(size_t i, int64_t block) {
    const size_t bb = pool->block_bytes();
    void* at = mmap(slot(i), bb, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, pool->fd(),
                    static_cast<off_t>(block * static_cast<int64_t>(bb)));
    if (at == MAP_FAILED) kv_pool_fail("mapping a block");
  }
  void unmap(size_t i) {
    void* at =
        mmap(slot(i), pool->block_bytes(), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    if (at == MAP_FAILED) kv_pool_fail("unmapping a block");
  }
  // Maps the first n blocks of `from` (each count + 1).
  void share(const KvPagedRange& from, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      pool->retain(from.blocks[i]);
      blocks.push_back(from.blocks[i]);
      map(i, from.blocks[i]);
    }
  }
  // Rows [begin, end) writable by this range alone: fresh blocks past the mapped ones, copies of shared ones.
  void own(int64_t begin, int64_t end) {
    const size_t bb = pool->block_bytes();
    for (int64_t i = begin / kKvBlockTokens; i * kKvBlockTokens < end; ++i) {
      const size_t s = static_cast<size_t>(i);
      if (s == blocks.size()) {
        blocks.push_back(pool->allocate());
        map(s, blocks.back());
      } else if (pool->refcount(blocks[s]) > 1) {  // copy-on-write
        const int64_t copy = pool->allocate();
        if (pwrite(pool->fd(), slot(s), bb, static_cast<off_t>(copy * static_cast<int64_t>(bb))) !=
            static_cast<ssize_t>(bb)) {
          pool->release(copy);
          kv_pool_fail("copying a shared block");
        }
        map(s, copy);
        pool->release(blocks[s]);
        blocks[s] = copy;
      }
    }
  }
  // Keeps the blocks holding the first `tokens` tokens.
  void keep(int64_t tokens) {
    const size_t n = static_cast<size_t>((tokens + kKvBlockTokens - 1) / kKvBlockTokens);
    while (blocks.size() > n) {
      unmap(blocks.size() - 1);
      pool->release(blocks.back());
      blocks.pop_back();
    }
  }
};

namespace {

// The pool for blocks of this row shape, or null when a block would not be whole pages.
KvBlockPool* kv_pool_for(const Tensor& like) {
  const size_t bb =
      static_cast<size_t>(kKvBlockTokens) * static_cast<size_t>(like.dim(1) * like.dim(2)) * dtype_size(like.dtype());
  if (bb % kv_page_bytes() != 0) return nullptr;
  return &KvBlockPool::for_block_bytes(bb);
}

Tensor kv_range_rows(const std::shared_ptr<KvPagedRange>& r) {
  Shape shape = {r->capacity};
  shape.insert(shape.end(), r->row.begin(), r->row.end());
  return Tensor::alias(r->base, shape, r->dtype, r);
}

}  // namespace

PagedKVCache::~PagedKVCache() = default;

bool PagedKVCache::decide(const Tensor& k, const Tensor& v) {
  if (keys_) return true;
  if (dense_) return false;
  KvBlockPool* kp = k.device() == Device::CPU && k.ndim() == 3 ? kv_pool_for(k) : nullptr;
  KvBlockPool* vp = v.device() == Device::CPU && v.ndim() == 3 ? kv_pool_for(v) : nullptr;
  if (!kp || !vp) {
    dense_ = std::make_unique<KVCache>();
    return false;
  }
  keys_ = std::make_shared<KvPagedRange>(*kp, Shape{k.dim(1), k.dim(2)}, k.dtype(), kKvBlockTokens);
  values_ = std::make_shared<KvPagedRange>(*vp, Shape{v.dim(1), v.dim(2)}, v.dtype(), kKvBlockTokens);
  key_rows_ = kv_range_rows(keys_);
  value_rows_ = kv_range_rows(values_);
  return true;
}

void PagedKVCache::make_room(int64_t end) {
  if (end > keys_->capacity) {  // a larger reservation mapping the same blocks: nothing is copied
    const int64_t tokens = std::max(end, 2 * keys_->capacity);
    auto grow = [&](const std::shared_ptr<KvPagedRange>& old) {
      auto r = std::make_shared<KvPagedRange>(*old->pool, old->row, old->dtype, tokens);
      r->share(*old, old->blocks.size());
      return r;
    };
    keys_ = grow(keys_);
    values_ = grow(values_);
    key_rows_ = kv_range_rows(keys_);
    value_rows_ = kv_range_rows(values_);
  }
  keys_->own(offset_, end);
  values_->own(offset_, end);
}

int64_t PagedKVCache::offset() const { return dense_ ? dense_->offset() : offset_; }

KVView PagedKVCache::view() const {
  KVView v;
  v.k = key_rows_.slice(0, 0, offset_);
  v.v = value_rows_.slice(0, 0, offset_);
  v.pos0 = 0;
  return v;
}

KVView PagedKVCache::update(const Tensor& k_in, const Tensor& v_in) {
  // On the CPU rows take the cache's type here (restored states too, whichever type their file holds).
  const Tensor k = kv_rows_as(k_in, cpu_store_), v = kv_rows_as(v_in, cpu_store_);
  if (!decide(k, v)) return dense_->update(k, v);
  const int64_t T = k.dim(0);
  make_room(offset_ + T);
  copy_rows(key_rows_, offset_, k, 0, T);
  copy_rows(value_rows_, offset_, v, 0, T);
  offset_ += T;
  return view();
}

CacheState PagedKVCache::state() const {
  if (dense_) return dense_->state();
  return kv_rows_state(kind(), key_rows_, value_rows_, offset_);
}

void PagedKVCache::restore(const CacheState& s) {
  const auto rows = kv_state_rows(s, kind());
  dense_.reset();
  keys_.reset();
  values_.reset();
  key_rows_ = Tensor();
  value_rows_ = Tensor();
  offset_ = 0;
  if (rows) update(*rows->first, *rows->second);
}

int64_t PagedKVCache::trim(int64_t n) {
  if (dense_) return dense_->trim(n);
  n = std::min(std::max<int64_t>(n, 0), offset_);
  offset_ -= n;
  if (keys_) {
    keys_->keep(offset_);
    values_->keep(offset_);
  }
  return n;
}

size_t PagedKVCache::bytes() const {
  if (dense_) return dense_->bytes();
  if (!keys_) return 0;
  return keys_->blocks.size() * keys_->pool->block_bytes() + values_->blocks.size() * values_->pool->block_bytes();
}

const void* PagedKVCache::replay_buffer() const { return dense_ ? dense_->replay_buffer() : nullptr; }

void PagedKVCache::replay_append() {
  if (dense_) dense_->replay_append();
}

std::optional<DirectRow> PagedKVCache::direct_row(const Tensor& like) {
  // The CPU writes through update() (which sees K and V and picks the blocks); a device cache is contiguous.
  if (keys_ || (!dense_ && like.device() == Device::CPU)) return std::nullopt;
  if (!dense_) dense_ = std::make_unique<KVCache>();
  return dense_->direct_row(like);
}

std::optional<DirectRow> PagedKVCache::graph_append(const Tensor& like) {
  if (keys_ || like.device() == Device::CPU) return std::nullopt;
  if (!dense_) dense_ = std::make_unique<KVCache>();
  return dense_->graph_append(like);
}

KVView PagedKVCache::commit_direct() {
  if (dense_) return dense_->commit_direct();
  return LayerCache::commit_direct();
}

std::unique_ptr<PagedKVCache> PagedKVCache::fork(int64_t tokens) const {
  if (!keys_ || tokens < 0 || tokens > offset_) return nullptr;
  auto out = std::make_unique<PagedKVCache>(cpu_store_);
  const size_t n = static_cast<size_t>((tokens + kKvBlockTokens - 1) / kKvBlockTokens);
  out->keys_ = std::make_shared<KvPagedRange>(*keys_->pool, keys_->row, keys_->dtype, tokens + kKvBlockTokens);
  out->values_ = std::make_shared<KvPagedRange>(*values_->pool, values_->row, values_->dtype, tokens + kKvBlockTokens);
  out->keys_->share(*keys_, n);
  out->values_->share(*values_, n);
  out->key_rows_ = kv_range_rows(out->keys_);
  out->value_rows_ = kv_range_rows(out->values_);
  out->offset_ = tokens;
  return out;
}

const std::vector<int64_t>& PagedKVCache::key_blocks() const {
  static const std::vector<int64_t> none;
  return keys_ ? keys_->blocks : none;
}
const std::vector<int64_t>& PagedKVCache::value_blocks() const {
  static const std::vector<int64_t> none;
  return values_ ? values_->blocks : none;
}
const KvBlockPool* PagedKVCache::key_pool() const { return keys_ ? keys_->pool : nullptr; }
const KvBlockPool* PagedKVCache::value_pool() const { return values_ ? values_->pool : nullptr; }

bool can_fork_cache_list(const CacheList& caches, int64_t tokens) {
  for (const auto& c : caches) {
    const auto* p = dynamic_cast<const PagedKVCache*>(c.get());
    if (!p || !p->paged() || p->offset() < tokens) return false;
  }
  return true;
}

std::optional<CacheList> fork_cache_list(const CacheList& caches, int64_t tokens) {
  if (!can_fork_cache_list(caches, tokens)) return std::nullopt;
  CacheList out;
  for (const auto& c : caches) out.push_back(static_cast<const PagedKVCache&>(*c).fork(tokens));
  return out;
}

}  // namespace lathe
