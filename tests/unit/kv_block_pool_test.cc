// The CPU's paged KV pool and the RAM tier on it: PagedKVCache keeps K/V (QuantizedKVCache its six quantized
// parts) in refcounted blocks of one memfd, a fork maps its parent's blocks (stored once), a write into a shared block
// copies it first and the parent never sees the child's rows; trimming and dropping caches give blocks back. Through
// the scheduler: two requests that share a system prompt run concurrently over one copy of the prefix (the pool's block
// and reference counts say so), each reports the prefix as cached and produces exactly its cold output; a request that
// arrives while another with the same prefix is running maps the running row's blocks.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "cache/kv_block_pool.h"
#include "cache/quantized_kv_cache.h"
#include "cache/row_tensors.h"
#include "engine/scheduler.h"
#include "support/fixtures.h"
#include "support/sequence_recorder.h"

namespace lathe {
namespace {

using testutil::Recorder;

// Rows [t, Hkv, D] whose values name their token: row t holds t + 0.001·(h·D + d) + salt.
Tensor paged_test_rows(int64_t begin, int64_t n, int64_t heads, int64_t dim, float salt) {
  std::vector<float> v;
  for (int64_t t = begin; t < begin + n; ++t)
    for (int64_t i = 0; i < heads * dim; ++i)
      v.push_back(static_cast<float>(t) + 0.001f * static_cast<float>(i) + salt);
  return Tensor::from_floats(v, {n, heads, dim});
}

int64_t paged_test_refs(const PagedKVCache& c, size_t block) { return c.key_pool()->refcount(c.key_blocks()[block]); }

// Whether shared memory is allocated in base pages (transparent huge pages for shmem off or on request only).
bool paged_test_shmem_pages_are_small() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
  std::string line;
  std::getline(f, line);
  return line.find("[always]") == std::string::npos && line.find("[force]") == std::string::npos &&
         line.find("[within_size]") == std::string::npos;
}

std::unique_ptr<PagedKVCache> paged_test_fork(const PagedKVCache& c, int64_t tokens) {
  return std::unique_ptr<PagedKVCache>(static_cast<PagedKVCache*>(c.fork(tokens).release()));
}

TEST(KvBlockPool, ForkSharesBlocksAndCopiesOnWrite) {
  const int64_t H = 2, D = 16;  // 128-byte rows: a 256-token block is 32 KiB
  const KvPoolStats base = kv_pool_stats();
  const int64_t block_bytes = kKvBlockTokens * H * D * 4;
  auto parent = std::make_unique<PagedKVCache>();
  const int64_t n = 2 * kKvBlockTokens + 40;  // two full blocks and a partial one
  parent->update(paged_test_rows(0, n, H, D, 0), paged_test_rows(0, n, H, D, 0.5f));
  ASSERT_TRUE(parent->paged());
  ASSERT_EQ(parent->key_blocks().size(), 3u);
  EXPECT_EQ(kv_pool_stats().blocks - base.blocks, 6);  // K and V
  EXPECT_EQ(kv_pool_stats().bytes - base.bytes, 6 * block_bytes);

  std::unique_ptr<PagedKVCache> child = paged_test_fork(*parent, n);
  ASSERT_TRUE(child);
  EXPECT_EQ(child->key_blocks(), parent->key_blocks());
  EXPECT_EQ(child->value_blocks(), parent->value_blocks());
  for (size_t b = 0; b < 3; ++b) EXPECT_EQ(paged_test_refs(*parent, b), 2);
  EXPECT_EQ(kv_pool_stats().blocks - base.blocks, 6);  // stored once
  EXPECT_EQ(kv_pool_stats().references - base.references, 12);

  // The child appends: its partial last block is copied (the parent's stays), the full ones stay shared.
  const KvPoolStats before_copy = kv_pool_stats();
  KVView cv = child->update(paged_test_rows(n, 16, H, D, 7), paged_test_rows(n, 16, H, D, 7.5f));
  // Only the 40 rows in use were copied, and a chunk of 16 written after them: 7,168 bytes, two pages each for K
  // and V, where the two new blocks are 64 KiB (with page-sized shared memory; huge pages would round up). (A
  // decode row would also make the pages after it, up to 64 KiB: RoomForAChunkIsPopulatedAtOnce.)
  const KvPoolStats after_copy = kv_pool_stats();
  EXPECT_EQ(after_copy.bytes - before_copy.bytes, 2 * block_bytes);
  if (paged_test_shmem_pages_are_small()) {
    EXPECT_LE(after_copy.resident - before_copy.resident, 2 * 2 * 4096);
    EXPECT_GT(after_copy.resident - before_copy.resident, 0);
  }
  EXPECT_EQ(child->offset(), n + 16);
  EXPECT_EQ(child->key_blocks()[0], parent->key_blocks()[0]);
  EXPECT_EQ(child->key_blocks()[1], parent->key_blocks()[1]);
  EXPECT_NE(child->key_blocks()[2], parent->key_blocks()[2]);
  EXPECT_EQ(paged_test_refs(*parent, 0), 2);
  EXPECT_EQ(paged_test_refs(*parent, 2), 1);
  EXPECT_EQ(kv_pool_stats().blocks - base.blocks, 8);

  // The child sees the shared prefix and its own rows; the parent is unchanged.
  const std::vector<float> want_prefix = paged_test_rows(0, n, H, D, 0).to_floats();
  const std::vector<float> got = cv.k.to_floats();
  ASSERT_EQ(got.size(), static_cast<size_t>((n + 16) * H * D));
  EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(want_prefix.size())),
            want_prefix);
  EXPECT_EQ(std::vector<float>(got.begin() + static_cast<std::ptrdiff_t>(want_prefix.size()), got.end()),
            paged_test_rows(n, 16, H, D, 7).to_floats());
  const CacheState ps = parent->state();
  EXPECT_EQ(ps.meta.at("offset"), n);
  EXPECT_EQ(ps.tensors[0].second.to_floats(), want_prefix);
  EXPECT_EQ(ps.tensors[1].second.to_floats(), paged_test_rows(0, n, H, D, 0.5f).to_floats());

  // The parent appends too, then grows past its reservation (remapped, not copied): still its own rows.
  parent->update(paged_test_rows(n, 3 * kKvBlockTokens, H, D, 1), paged_test_rows(n, 3 * kKvBlockTokens, H, D, 1.5f));
  EXPECT_EQ(child->state().tensors[0].second.to_floats(), cv.k.to_floats());
  EXPECT_EQ(paged_test_refs(*child, 0), 2);

  // A fork at a block boundary, trimmed back into its first block, then written: the shared block is copied.
  std::unique_ptr<PagedKVCache> second = paged_test_fork(*parent, kKvBlockTokens);
  EXPECT_EQ(paged_test_refs(*parent, 0), 3);
  EXPECT_EQ(second->trim(kKvBlockTokens - 5), kKvBlockTokens - 5);
  second->update(paged_test_rows(5, 1, H, D, 9), paged_test_rows(5, 1, H, D, 9));
  EXPECT_EQ(paged_test_refs(*parent, 0), 2);
  EXPECT_EQ(parent->state().tensors[0].second.slice(0, 5, 6).to_floats(), paged_test_rows(5, 1, H, D, 0).to_floats());
  EXPECT_EQ(second->state().tensors[0].second.slice(0, 5, 6).to_floats(), paged_test_rows(5, 1, H, D, 9).to_floats());
  // The copy took the rows before the write (only those: the rest of the block is the fork's to write).
  EXPECT_EQ(second->state().tensors[0].second.slice(0, 0, 5).to_floats(), paged_test_rows(0, 5, H, D, 0).to_floats());
  EXPECT_EQ(second->state().tensors[1].second.slice(0, 0, 5).to_floats(),
            paged_test_rows(0, 5, H, D, 0.5f).to_floats());

  // Trimming gives whole blocks back; dropping every cache returns the pool to where it was.
  const int64_t before_trim = kv_pool_stats().blocks;
  parent->trim(parent->offset() - 10);
  EXPECT_EQ(parent->key_blocks().size(), 1u);
  EXPECT_LT(kv_pool_stats().blocks, before_trim);
  cv = KVView();  // a view keeps its cache's blocks alive too
  parent.reset();
  child.reset();
  second.reset();
  EXPECT_EQ(kv_pool_stats().blocks, base.blocks);
  EXPECT_EQ(kv_pool_stats().references, base.references);
}

TEST(KvBlockPool, StateRoundTripsLikeTheContiguousCache) {
  const int64_t H = 2, D = 16, n = kKvBlockTokens + 17;
  PagedKVCache paged;
  KVCache dense;
  paged.update(paged_test_rows(0, n, H, D, 0), paged_test_rows(0, n, H, D, 3));
  dense.update(paged_test_rows(0, n, H, D, 0), paged_test_rows(0, n, H, D, 3));
  const CacheState a = paged.state(), b = dense.state();
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.meta, b.meta);
  ASSERT_EQ(a.tensors.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(a.tensors[i].second.to_floats(), b.tensors[i].second.to_floats());
  PagedKVCache back;
  back.restore(a);
  EXPECT_TRUE(back.paged());
  EXPECT_EQ(back.state().tensors[1].second.to_floats(), b.tensors[1].second.to_floats());
  // fork_cache_list needs every cache paged.
  CacheList list;
  list.push_back(std::make_unique<PagedKVCache>());
  list[0]->update(paged_test_rows(0, 4, H, D, 0), paged_test_rows(0, 4, H, D, 0));
  EXPECT_TRUE(fork_cache_list(list, 3).has_value());
  EXPECT_FALSE(fork_cache_list(list, 5).has_value());
  list.push_back(std::make_unique<KVCache>());
  EXPECT_FALSE(fork_cache_list(list, 3).has_value());
}

// Each block is a kernel VMA: once the server knows its KV budget, blocks are long enough that the budget, filled
// with caches of one shape, maps at most half of vm.max_map_count.
// Room made for rows is backed by pages at once (MADV_POPULATE_WRITE: one call, not a fault per page as the rows
// are written): a prefill chunk's pages, a decode row's page and a few after it in its block. On a kernel without
// it, nothing to check.
TEST(KvBlockPool, RoomForAChunkIsPopulatedAtOnce) {
#ifndef MADV_POPULATE_WRITE
  GTEST_SKIP() << "no MADV_POPULATE_WRITE in these headers";
#else
  void* probe = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(probe, MAP_FAILED);
  const bool supported = madvise(probe, 4096, MADV_POPULATE_WRITE) == 0;
  munmap(probe, 4096);
  if (!supported) GTEST_SKIP() << "the kernel has no MADV_POPULATE_WRITE";
  const int64_t H = 8, D = 128;  // 4 KiB rows (f32): a row is a page
  RowTensors like;
  like.parts = {Tensor::empty({1, H, D}, DType::F32), Tensor::empty({1, H, D}, DType::F32)};
  std::unique_ptr<PagedRows> rows = PagedRows::create(like);
  ASSERT_TRUE(rows);
  auto resident_pages = [&](size_t part, int64_t begin, int64_t end) {
    const auto* base = static_cast<const char*>(rows->rows().parts[part].raw());
    std::vector<unsigned char> in(static_cast<size_t>(end - begin));
    EXPECT_EQ(mincore(const_cast<char*>(base) + begin * 4096, static_cast<size_t>(end - begin) * 4096, in.data()), 0);
    int64_t n = 0;
    for (unsigned char c : in) n += c & 1;
    return n;
  };
  rows->make_room(0, 300);  // a chunk: every page of K and V made now, before any row is written
  EXPECT_EQ(resident_pages(0, 0, 300), 300);
  EXPECT_EQ(resident_pages(1, 0, 300), 300);
  EXPECT_EQ(resident_pages(0, 300, 512), 0);  // not rows no one asked room for
  // A decode row: its page and the next ones, 64 KiB at a time (16 rows here), within its block.
  rows->make_room(300, 301);
  EXPECT_EQ(resident_pages(0, 300, 316), 16);
  EXPECT_EQ(resident_pages(1, 300, 316), 16);
  EXPECT_EQ(resident_pages(0, 316, 512), 0);
  rows->make_room(301, 302);  // already made: no call
  EXPECT_EQ(resident_pages(0, 316, 512), 0);
  rows->make_room(316, 317);
  EXPECT_EQ(resident_pages(0, 316, 332), 16);
  // Past a trim the pages are given back, and made again when rows are written there.
  rows->keep(100);
  rows->make_room(100, 101);
  EXPECT_EQ(resident_pages(0, 100, 116), 16);
  rows->keep(256);  // the first block only: rows from 256 map a fresh block, its pages holes
  rows->make_room(256, 257);
  EXPECT_EQ(resident_pages(0, 256, 272), 16);
  EXPECT_EQ(resident_pages(0, 272, 512), 0);

  // Narrow rows (32 bytes, like quantized scales): at most 64 rows ahead, so one page, not 64 KiB.
  RowTensors narrow_like;
  narrow_like.parts = {Tensor::empty({1, 8}, DType::F32), Tensor::empty({1, 8}, DType::F32)};
  std::unique_ptr<PagedRows> narrow = PagedRows::create(narrow_like);
  ASSERT_TRUE(narrow);
  narrow->make_room(0, 1);
  const size_t block_pages = static_cast<size_t>(narrow->block_tokens()) * 32 / 4096;
  ASSERT_GE(block_pages, 2u);
  std::vector<unsigned char> in(block_pages);
  ASSERT_EQ(mincore(narrow->rows().parts[0].raw(), block_pages * 4096, in.data()), 0);
  size_t made = 0;
  for (unsigned char c : in) made += c & 1;
  EXPECT_EQ(made, 1u) << "of " << block_pages << " pages in the block";
#endif
}

TEST(KvBlockPool, BlockLengthFollowsTheBudget) {
  const int64_t bf16_06b = 2 * 8 * 128 * 2;  // K and V of a Qwen3-0.6B layer in bf16, bytes a token
  EXPECT_EQ(kv_block_tokens_for(0, bf16_06b, 2, 65530), kKvBlockTokens);                  // no budget known
  EXPECT_EQ(kv_block_tokens_for(int64_t{10} << 30, bf16_06b, 2, 65530), kKvBlockTokens);  // 20.5k blocks
  EXPECT_EQ(kv_block_tokens_for(int64_t{60} << 30, bf16_06b, 2, 65530), 4 * kKvBlockTokens);
  EXPECT_EQ(kv_block_tokens_for(int64_t{10} << 30, 2 * 2 * 64 * 2, 2, 65530), 8 * kKvBlockTokens);  // 2 heads of 64
  const int64_t q8 = 2 * (8 * 128 + 8 * 2 * 2 * 4);  // 8-bit K/V with f32 scales and biases per 64 values
  EXPECT_EQ(kv_block_tokens_for(int64_t{10} << 30, q8, 6, 65530), 4 * kKvBlockTokens);
  EXPECT_EQ(kv_block_tokens_for(int64_t{1} << 62, bf16_06b, 2, 65530), kKvBlockTokensMax);  // an absurd budget

  const int64_t H = 8, D = 128;  // f32 rows: 8 KiB a token for K and V
  set_kv_pool_budget(int64_t{60} << 30);
  PagedKVCache big;
  big.update(paged_test_rows(0, 3, H, D, 0), paged_test_rows(0, 3, H, D, 0));
  set_kv_pool_budget(0);
  PagedKVCache plain;
  plain.update(paged_test_rows(0, 3, H, D, 0), paged_test_rows(0, 3, H, D, 0));
  EXPECT_EQ(big.block_tokens(), kv_block_tokens_for(int64_t{60} << 30, 2 * H * D * 4, 2, vm_map_limit()));
  EXPECT_GT(big.block_tokens(), kKvBlockTokens);
  EXPECT_EQ(plain.block_tokens(), kKvBlockTokens);
  EXPECT_EQ(big.state().tensors[0].second.to_floats(), plain.state().tensors[0].second.to_floats());
  EXPECT_GE(vm_map_limit(), 1);
}

// Every tensor of two states bit for bit, and their metadata.
bool paged_test_same_state(const CacheState& a, const CacheState& b) {
  if (a.kind != b.kind || a.meta != b.meta || a.tensors.size() != b.tensors.size()) return false;
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const Tensor x = a.tensors[i].second.contiguous(), y = b.tensors[i].second.contiguous();
    if (a.tensors[i].first != b.tensors[i].first || x.shape() != y.shape() || x.dtype() != y.dtype() ||
        std::memcmp(x.raw(), y.raw(), x.nbytes()) != 0)
      return false;
  }
  return true;
}

// Quantized K/V (six row tensors: codes, scales and biases of K and V) page like full-precision K/V, in blocks of
// 1,024 tokens (six parts map no more blocks per token than K and V in 256-token blocks).
TEST(KvBlockPool, QuantizedCachesShareBlocksAndCopyOnWrite) {
  const int64_t H = 2, D = 16, n = 2 * 4 * kKvBlockTokens + 452;  // two full blocks and part of a third
  const KvPoolStats base = kv_pool_stats();
  auto whole = std::make_unique<QuantizedKVCache>(8, 64);
  KVView wv = whole->update(paged_test_rows(0, n, H, D, 0), paged_test_rows(0, n, H, D, 0.5f));
  ASSERT_TRUE(whole->paged());
  const int64_t bt = whole->paged_rows()->block_tokens();
  EXPECT_EQ(bt, 4 * kKvBlockTokens);
  ASSERT_EQ(whole->paged_rows()->blocks(0).size(), 3u);
  EXPECT_EQ(kv_pool_stats().blocks - base.blocks, 18);  // three blocks of each of six parts
  EXPECT_EQ(whole->bytes(), whole->paged_rows()->bytes());
  const CacheState before = whole->state();

  // A fork at a block boundary maps the first block; its appends take fresh blocks. Rows are quantized one by
  // one, so the fork extended to n tokens holds exactly what `whole` holds, and `whole` is unchanged.
  ASSERT_TRUE(whole->can_fork(bt));
  EXPECT_FALSE(whole->can_fork(n + 1));
  std::unique_ptr<LayerCache> at_block = whole->fork(bt);
  ASSERT_TRUE(at_block);
  const auto& ab = static_cast<QuantizedKVCache&>(*at_block);
  EXPECT_EQ(ab.paged_rows()->blocks(0)[0], whole->paged_rows()->blocks(0)[0]);
  EXPECT_EQ(whole->paged_rows()->pool(0)->refcount(whole->paged_rows()->blocks(0)[0]), 2);
  KVView fv = at_block->update(paged_test_rows(bt, n - bt, H, D, 0), paged_test_rows(bt, n - bt, H, D, 0.5f));
  EXPECT_EQ(kv_pool_stats().blocks - base.blocks, 30);  // blocks 1 and 2 of the fork are its own
  EXPECT_TRUE(paged_test_same_state(at_block->state(), before));
  EXPECT_TRUE(paged_test_same_state(whole->state(), before));
  ASSERT_EQ(fv.qk.w.shape(), wv.qk.w.shape());
  EXPECT_EQ(std::memcmp(fv.qv.scales.contiguous().raw(), wv.qv.scales.contiguous().raw(), wv.qv.scales.nbytes()), 0);

  // A fork inside a block copies that block when it writes: `whole` never sees the fork's rows.
  std::unique_ptr<LayerCache> inside = whole->fork(300);
  inside->update(paged_test_rows(300, 10, H, D, 9), paged_test_rows(300, 10, H, D, 9.5f));
  EXPECT_EQ(inside->offset(), 310);
  EXPECT_NE(static_cast<QuantizedKVCache&>(*inside).paged_rows()->blocks(0)[0], whole->paged_rows()->blocks(0)[0]);
  EXPECT_TRUE(paged_test_same_state(whole->state(), before));
  QuantizedKVCache check(8, 64);
  check.update(paged_test_rows(0, 300, H, D, 0), paged_test_rows(0, 300, H, D, 0.5f));
  check.update(paged_test_rows(300, 10, H, D, 9), paged_test_rows(300, 10, H, D, 9.5f));
  EXPECT_TRUE(paged_test_same_state(inside->state(), check.state()));

  // Trim and restore keep the paging; the restored cache forks too.
  EXPECT_EQ(inside->trim(200), 200);
  EXPECT_EQ(static_cast<QuantizedKVCache&>(*inside).paged_rows()->blocks(0).size(), 1u);
  QuantizedKVCache restored(8, 64);
  restored.restore(before);
  EXPECT_TRUE(restored.paged());
  EXPECT_TRUE(paged_test_same_state(restored.state(), before));
  EXPECT_TRUE(restored.can_fork(n));

  // A list of quantized caches forks as a whole.
  CacheList list;
  list.push_back(std::make_unique<QuantizedKVCache>(4, 32));
  list[0]->update(paged_test_rows(0, 4, H, D, 0), paged_test_rows(0, 4, H, D, 0));
  EXPECT_TRUE(fork_cache_list(list, 4).has_value());

  whole.reset();
  at_block.reset();
  inside.reset();
  restored.restore(CacheState{"quantized", {}, {{"offset", 0}, {"bits", 8}, {"group_size", 64}}});
  check.trim(check.offset());
  list.clear();
  wv = KVView();  // views keep their blocks too
  fv = KVView();
  EXPECT_EQ(kv_pool_stats().blocks, base.blocks);
  EXPECT_EQ(kv_pool_stats().references, base.references);
}

// A scheduler over the qwen3 fixture (2 layers, 2 KV heads of 16) whose caches keep K/V in `Parts` row tensors
// paged in blocks of `BlockTokens` tokens: full-precision K and V (Bits 0), or quantized triples.
template <int Bits, int Parts, int BlockTokens>
class PrefixFixture : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    CacheOptions c;
    c.kv_bits = Bits;
    bundle_ = new ModelBundle(test::model_dir("qwen3-q4g64"), {}, c);
  }
  static void TearDownTestSuite() { delete bundle_; }
  static void run(Scheduler& s) {
    for (int i = 0; i < 100000 && !s.idle(); ++i) s.step();
  }
  static std::vector<int32_t> system_prompt() {  // two full blocks and 88 tokens of a third
    std::vector<int32_t> p;
    for (int k = 0; k < 2 * BlockTokens + 88; ++k) p.push_back(static_cast<int32_t>(7 + k * 13) % 590 + 3);
    return p;
  }
  static std::vector<int32_t> with(std::vector<int32_t> p, int32_t first, int n) {
    for (int k = 0; k < n; ++k) p.push_back(first + 3 * k);
    return p;
  }
  static GenerateOptions greedy(int max_tokens) {
    GenerateOptions o;
    o.max_tokens = max_tokens;
    o.eos_ids = {-5};  // never: lengths stay fixed
    return o;
  }
  // The request alone on a fresh scheduler: a cold prefill.
  static std::vector<int32_t> cold(const std::vector<int32_t>& prompt, int max_tokens) {
    SchedulerOptions o;
    o.kv_cache_bytes = int64_t{1} << 30;
    Scheduler s(*bundle_, o);
    auto rec = std::make_shared<Recorder>();
    s.add(prompt, greedy(max_tokens), rec);
    run(s);
    EXPECT_EQ(rec->result->cached_tokens, 0);
    return rec->ids;
  }
  // The blocks of one sequence holding `tokens` tokens, over its parts and the model's layers.
  static int64_t blocks_for(int64_t tokens) {
    return Parts * bundle_->model().config().num_layers * ((tokens + BlockTokens - 1) / BlockTokens);
  }
  // Two requests extending a kept system prompt run side by side over one copy of its full blocks.
  static void two_concurrent_requests_share_the_system_prompt();
  // A request arriving while another with the same prefix runs maps the running row's blocks.
  static void a_later_request_maps_a_running_rows_prefix();
  static ModelBundle* bundle_;
};
template <int Bits, int Parts, int BlockTokens>
ModelBundle* PrefixFixture<Bits, Parts, BlockTokens>::bundle_ = nullptr;

using SharedPrefixTest = PrefixFixture<0, 2, kKvBlockTokens>;
using SharedQuantizedPrefixTest = PrefixFixture<8, 6, 4 * kKvBlockTokens>;

template <int Bits, int Parts, int BlockTokens>
void PrefixFixture<Bits, Parts, BlockTokens>::two_concurrent_requests_share_the_system_prompt() {
  const std::vector<int32_t> sys = system_prompt();
  const int64_t S = static_cast<int64_t>(sys.size());
  const std::vector<int32_t> pa = with(sys, 40, 20), pb = with(sys, 41, 23);
  const std::vector<int32_t> want_a = cold(pa, 12), want_b = cold(pb, 12);
  const KvPoolStats base = kv_pool_stats();
  {
    SchedulerOptions o;
    o.kv_cache_bytes = int64_t{1} << 30;
    Scheduler s(*bundle_, o);
    // The system prompt alone first: its cache stays for reuse (the prompt; max_tokens 1 feeds nothing more).
    auto w = std::make_shared<Recorder>();
    s.add(sys, greedy(1), w);
    run(s);
    const int64_t kept = blocks_for(S);
    ASSERT_EQ(kv_pool_stats().blocks - base.blocks, kept);

    auto a = std::make_shared<Recorder>(), b = std::make_shared<Recorder>();
    s.add(pa, greedy(12), a);
    s.add(pb, greedy(12), b);
    s.step();  // both admitted, both feed their 20 / 23 new tokens and sample their first token
    ASSERT_EQ(s.stats().running, 2);
    ASSERT_EQ(a->ids.size(), 1u);
    ASSERT_EQ(b->ids.size(), 1u);
    // The two full blocks of every K and V are mapped by three caches (kept, a, b); each row copied only the
    // partial third block it wrote into.
    const int64_t full = blocks_for(S / BlockTokens * BlockTokens), partial = kept - full;
    ASSERT_GT(full, 0);
    const KvPoolStats now = kv_pool_stats();
    EXPECT_EQ(now.blocks - base.blocks, kept + 2 * partial);
    EXPECT_EQ(now.references - base.references, 3 * kept);
    if (Bits == 0) {
      EXPECT_EQ(now.bytes - base.bytes, (now.blocks - base.blocks) * kKvBlockTokens *
                                            bundle_->model().config().num_kv_heads *
                                            bundle_->model().config().head_dim * 4);
    }
    EXPECT_LT(now.blocks - base.blocks, 3 * kept);  // what three private copies would hold
    run(s);
    ASSERT_TRUE(a->result && b->result);
    EXPECT_EQ(a->result->cached_tokens, S);
    EXPECT_EQ(b->result->cached_tokens, S);
    EXPECT_EQ(a->ids, want_a);
    EXPECT_EQ(b->ids, want_b);
    EXPECT_EQ(s.cache_stats().ram_hits, 2);
    // The system prompt's own entry went when a's extension of it was kept: a and b remain.
    s.housekeeping();
    EXPECT_EQ(s.cache_stats().ram_entries, 2);
  }
  EXPECT_EQ(kv_pool_stats().blocks, base.blocks);  // every block back once the scheduler is gone
  EXPECT_EQ(kv_pool_stats().references, base.references);
}

TEST_F(SharedPrefixTest, TwoConcurrentRequestsShareTheSystemPromptStoredOnce) {
  two_concurrent_requests_share_the_system_prompt();
}

// With --kv-bits the prompt cache shares prefixes too: quantized rows in the same pool, forked the same way,
// each request still exactly its cold output.
TEST_F(SharedQuantizedPrefixTest, TwoConcurrentRequestsShareTheSystemPromptStoredOnce) {
  two_concurrent_requests_share_the_system_prompt();
}

template <int Bits, int Parts, int BlockTokens>
void PrefixFixture<Bits, Parts, BlockTokens>::a_later_request_maps_a_running_rows_prefix() {
  const std::vector<int32_t> sys = system_prompt();
  const int64_t S = static_cast<int64_t>(sys.size());
  const std::vector<int32_t> pa = with(sys, 60, 12), pc = with(sys, 61, 9);
  const std::vector<int32_t> want_c = cold(pc, 6);
  const KvPoolStats base = kv_pool_stats();
  {
    SchedulerOptions o;
    o.kv_cache_bytes = int64_t{1} << 30;
    o.reuse_slots = 0;  // no kept caches: only the running row can serve
    Scheduler s(*bundle_, o);
    auto a = std::make_shared<Recorder>();
    s.add(pa, greedy(40), a);
    while (a->ids.empty()) s.step();  // a's prompt is in its cache
    const int64_t a_blocks = kv_pool_stats().blocks - base.blocks;
    auto c = std::make_shared<Recorder>();
    s.add(pc, greedy(6), c);
    s.step();
    ASSERT_EQ(s.stats().running, 2);
    // c maps a's two full blocks per K and V, and owns a copy of the third it wrote into.
    EXPECT_EQ(kv_pool_stats().blocks - base.blocks, a_blocks + (blocks_for(S) - blocks_for(2 * BlockTokens)));
    run(s);
    ASSERT_TRUE(c->result);
    EXPECT_EQ(c->result->cached_tokens, S);
    EXPECT_EQ(c->ids, want_c);
    EXPECT_EQ(a->ids.size(), 40u);
  }
  EXPECT_EQ(kv_pool_stats().blocks, base.blocks);
}

TEST_F(SharedPrefixTest, ALaterRequestMapsARunningRowsPrefix) { a_later_request_maps_a_running_rows_prefix(); }

TEST_F(SharedQuantizedPrefixTest, ALaterRequestMapsARunningRowsPrefix) { a_later_request_maps_a_running_rows_prefix(); }

}  // namespace
}  // namespace lathe
