// KvBlockPool (blocks of one memfd, refcounted) and PagedRows (row tensors mapped from its blocks).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "cache/kv_block_pool.h"
#include "common/error.h"
#include "tensor/host_buffer_cache.h"

namespace lathe {

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
  struct stat st {};
  if (fstat(fd_, &st) == 0) s.resident = static_cast<int64_t>(st.st_blocks) * 512;  // st_blocks: 512-byte units
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
    total.resident += s.resident;
  }
  return total;
}

struct KvPagedRange {
  KvBlockPool* pool = nullptr;
  char* base = nullptr;
  int64_t capacity = 0;  // tokens the reservation holds (whole blocks)
  Shape row;             // one token's row ([Hkv, D] for K or V)
  DType dtype = DType::F32;
  size_t row_bytes = 0;
  int64_t block_tokens = kKvBlockTokens;
  std::vector<int64_t> blocks;  // block i holds tokens [i·block_tokens, (i+1)·block_tokens)
  size_t populated = 0;         // bytes from base whose pages populate() has made (decode rows look ahead)

  KvPagedRange(KvBlockPool& p, const Shape& row_shape, DType type, int64_t block_tokens_in, int64_t tokens)
      : pool(&p), row(row_shape), dtype(type), block_tokens(block_tokens_in) {
    row_bytes = static_cast<size_t>(shape_numel(row)) * dtype_size(dtype);
    capacity = std::max<int64_t>(1, (tokens + block_tokens - 1) / block_tokens) * block_tokens;
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
    for (int64_t i = begin / block_tokens; i * block_tokens < end; ++i) {
      const size_t s = static_cast<size_t>(i);
      if (s == blocks.size()) {
        blocks.push_back(pool->allocate());
        map(s, blocks.back());
        repopulate_from(s);
      } else if (pool->refcount(blocks[s]) > 1) {  // copy-on-write
        // Only the rows before `begin` hold tokens (rows from there on are being written or unused), so only
        // they are copied: the rest of the fresh block stays a hole until written.
        const int64_t kept_rows = std::clamp<int64_t>(begin - i * block_tokens, 0, block_tokens);
        const size_t n = static_cast<size_t>(kept_rows) * row_bytes;
        const int64_t copy = pool->allocate();
        if (n > 0 && pwrite(pool->fd(), slot(s), n, static_cast<off_t>(copy * static_cast<int64_t>(bb))) !=
                         static_cast<ssize_t>(n)) {
          pool->release(copy);
          kv_pool_fail("copying a shared block");
        }
        map(s, copy);
        repopulate_from(s);
        pool->release(blocks[s]);
        blocks[s] = copy;
      }
    }
    populate(begin, end);
  }
  // Rows about to be written get their pages in one call instead of one fault (a trap, costly in a VM) each: a
  // prefill chunk's the pages it wholly covers (4,000-token prefill of the 0.6B shape: 0.1 M faults fewer, ~0.7 s
  // less in the kernel), a decode row's its page and the next ones of its block, up to 64 rows or 64 KiB at a
  // time (a call every 32 bf16 rows of the 0.6B shape instead of a fault every 2). On a kernel without
  // MADV_POPULATE_WRITE (before 5.14) the call fails and they fault as before (populate_host_pages).
  void populate(int64_t begin, int64_t end) {
    constexpr int64_t kMinRows = 16;
    constexpr size_t kAheadBytes = size_t{64} << 10;
    constexpr int64_t kAheadRows = 64;
    static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t lo = static_cast<size_t>(begin) * row_bytes, hi = static_cast<size_t>(end) * row_bytes;
    size_t from = (lo + page - 1) / page * page, to = hi / page * page;  // pages wholly written
    if (end - begin < kMinRows) {
      if (hi <= populated) return;
      const size_t block_end = static_cast<size_t>(begin / block_tokens + 1) * pool->block_bytes();
      from = lo / page * page;
      // At most 64 rows ahead (a narrow part, like quantized scales, would otherwise make pages for thousands).
      const size_t ahead = std::min(kAheadBytes, std::max(page, static_cast<size_t>(kAheadRows) * row_bytes));
      to = std::min(block_end, std::max(from + ahead, (hi + page - 1) / page * page));
    }
    if (to <= from) return;
    populate_host_pages(base + from, to - from);
    populated = std::max(populated, to);
  }
  // A block mapped at slot s starts as holes (or rows copied in): pages made ahead before it no longer count.
  void repopulate_from(size_t s) { populated = std::min(populated, s * pool->block_bytes()); }
  // Keeps the blocks holding the first `tokens` tokens.
  void keep(int64_t tokens) {
    const size_t n = static_cast<size_t>((tokens + block_tokens - 1) / block_tokens);
    while (blocks.size() > n) {
      unmap(blocks.size() - 1);
      pool->release(blocks.back());
      blocks.pop_back();
    }
    repopulate_from(blocks.size());
  }
};

// ---- block length from the KV budget ----

namespace {
std::atomic<int64_t> g_kv_pool_budget{0};
}  // namespace

void set_kv_pool_budget(int64_t bytes) { g_kv_pool_budget.store(std::max<int64_t>(bytes, 0)); }
int64_t kv_pool_budget() { return g_kv_pool_budget.load(); }

int64_t vm_map_limit() {
  static const int64_t limit = [] {
    int64_t v = 0;
    if (std::FILE* f = std::fopen("/proc/sys/vm/max_map_count", "r")) {
      long long x = 0;
      if (std::fscanf(f, "%lld", &x) == 1) v = x;
      std::fclose(f);
    }
    return v > 0 ? v : int64_t{65530};
  }();
  return limit;
}

int64_t kv_block_tokens_for(int64_t budget_bytes, int64_t row_bytes, int64_t parts, int64_t map_limit) {
  int64_t tokens = kKvBlockTokens;
  if (budget_bytes <= 0 || row_bytes <= 0 || parts <= 0 || map_limit <= 0) return tokens;
  // The budget holds budget / row_bytes tokens; each block of `tokens` maps `parts` VMAs.
  const long double blocks_allowed = static_cast<long double>(map_limit) / 2;
  const long double capacity = static_cast<long double>(budget_bytes) / static_cast<long double>(row_bytes);
  // At most 65,536 tokens: a budget past the machine's memory (the flag takes any size) would otherwise ask for
  // blocks, and address space reservations, of any size.
  while (capacity / static_cast<long double>(tokens) * static_cast<long double>(parts) > blocks_allowed &&
         tokens < kKvBlockTokensMax)
    tokens *= 2;
  return tokens;
}

// ---- PagedRows ----

namespace {

Tensor paged_range_rows(const std::shared_ptr<KvPagedRange>& r) {
  Shape shape = {r->capacity};
  shape.insert(shape.end(), r->row.begin(), r->row.end());
  return Tensor::alias(r->base, shape, r->dtype, r);
}

}  // namespace

std::unique_ptr<PagedRows> PagedRows::create(const RowTensors& like) {
  if (!like.defined()) return nullptr;
  std::vector<size_t> row_bytes;
  for (const Tensor& t : like.parts) {
    if (!t.defined() || t.device() != Device::CPU || t.ndim() < 2) return nullptr;
    row_bytes.push_back(static_cast<size_t>(kv_row_bytes(t)));
  }
  // Each mapped block is a kernel VMA (vm.max_map_count): rows kept in more parts than K and V take longer
  // blocks, so a cache maps no more blocks per token than K and V in 256-token blocks (quantized K/V's six parts:
  // 1,024 tokens, about the bytes of a 256-token bf16 block).
  int64_t unit = kKvBlockTokens;
  while (unit / kKvBlockTokens * 2 < static_cast<int64_t>(row_bytes.size())) unit *= 2;
  if (const int64_t budget = kv_pool_budget(); budget > 0) {
    int64_t total = 0;
    for (size_t b : row_bytes) total += static_cast<int64_t>(b);
    unit = std::max(unit, kv_block_tokens_for(budget, total, static_cast<int64_t>(row_bytes.size()), vm_map_limit()));
  }
  // Then the fewest of those at which every part's block is whole pages (narrow rows, such as small heads'
  // quantization scales, need more).
  int64_t tokens = 0;
  for (int64_t m = 1; m <= 16 && tokens == 0; ++m) {
    bool whole = true;
    for (size_t b : row_bytes) whole = whole && b > 0 && (b * static_cast<size_t>(m * unit)) % kv_page_bytes() == 0;
    if (whole) tokens = m * unit;
  }
  if (tokens == 0) return nullptr;
  std::unique_ptr<PagedRows> out(new PagedRows());
  out->block_tokens_ = tokens;
  for (size_t i = 0; i < like.parts.size(); ++i) {
    const Tensor& t = like.parts[i];
    const Shape row(t.shape().begin() + 1, t.shape().end());
    KvBlockPool& pool = KvBlockPool::for_block_bytes(row_bytes[i] * static_cast<size_t>(tokens));
    out->ranges_.push_back(std::make_shared<KvPagedRange>(pool, row, t.dtype(), tokens, tokens));
  }
  out->alias();
  return out;
}

PagedRows::~PagedRows() = default;

void PagedRows::alias() {
  rows_.parts.clear();
  for (const auto& r : ranges_) rows_.parts.push_back(paged_range_rows(r));
}

void PagedRows::make_room(int64_t begin, int64_t end) {
  if (end > ranges_[0]->capacity) {  // a larger reservation mapping the same blocks: nothing is copied
    const int64_t tokens = std::max(end, 2 * ranges_[0]->capacity);
    for (auto& old : ranges_) {
      auto r = std::make_shared<KvPagedRange>(*old->pool, old->row, old->dtype, block_tokens_, tokens);
      r->share(*old, old->blocks.size());
      old = r;
    }
    alias();
  }
  for (auto& r : ranges_) r->own(begin, end);
}

void PagedRows::keep(int64_t tokens) {
  for (auto& r : ranges_) r->keep(tokens);
}

std::unique_ptr<PagedRows> PagedRows::fork(int64_t tokens) const {
  std::unique_ptr<PagedRows> out(new PagedRows());
  out->block_tokens_ = block_tokens_;
  const size_t n = static_cast<size_t>((tokens + block_tokens_ - 1) / block_tokens_);
  for (const auto& r : ranges_) {
    auto f = std::make_shared<KvPagedRange>(*r->pool, r->row, r->dtype, block_tokens_, tokens + block_tokens_);
    f->share(*r, std::min(n, r->blocks.size()));
    out->ranges_.push_back(std::move(f));
  }
  out->alias();
  return out;
}

size_t PagedRows::bytes() const {
  size_t n = 0;
  for (const auto& r : ranges_) n += r->blocks.size() * r->pool->block_bytes();
  return n;
}

const std::vector<int64_t>& PagedRows::blocks(size_t part) const { return ranges_.at(part)->blocks; }
const KvBlockPool* PagedRows::pool(size_t part) const { return ranges_.at(part)->pool; }

}  // namespace lathe
