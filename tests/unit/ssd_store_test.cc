// The SSD tier: store -> restore continues bit-identically; longest prefix wins; one growing file per
// conversation; namespaces and identities never share; the cap on disk bytes holds after every save; scan
// removes .tmp orphans and corrupt files of its own identity only; a corrupt file on restore is a deleted miss;
// a failing disk makes save return false without throwing.
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include <gtest/gtest.h>

#include "cache/cache_identity.h"
#include "cache/ssd_store.h"
#include "common/fixture_reference.h"
#include "model/model.h"
#include "support/kv_test_util.h"

namespace lathe {
namespace {

namespace fs = std::filesystem;
using kvtest::TempDir;

struct Fixture {
  std::unique_ptr<Model> model;
  CacheOptions opts;
  CacheIdentity identity;
  CacheLayout layout;
  TempDir dir;

  explicit Fixture(const std::string& name = "gemma3-bf16", int kv_bits = 0) {
    model = load_model(testing::fixture_dir(name));
    opts.kv_bits = kv_bits;
    opts.kv_group_size = 32;
    identity = cache_identity(*model, opts);
    layout = probe_cache_layout(*model, opts);
  }
  std::unique_ptr<SsdStore> store(uint64_t cap = 1ull << 30, bool verify = false) {
    SsdStoreOptions o;
    o.dir = dir.path;
    o.max_bytes = cap;
    o.verify = verify;
    auto s = std::make_unique<SsdStore>(o, identity, layout, [this] { return model->make_cache(opts); });
    s->scan();
    return s;
  }
  CacheList prefill(const std::vector<int32_t>& ids) {
    CacheList c = model->make_cache(opts);
    model->forward(ids, c, false);
    return c;
  }
};

std::vector<int32_t> seq(int n, int start = 1) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = (start + i) % 90 + 1;
  return v;
}

size_t files_with(const std::string& dir, const std::string& ext) {
  size_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file() && e.path().string().size() >= ext.size() &&
        e.path().string().compare(e.path().string().size() - ext.size(), ext.size(), ext) == 0)
      ++n;
  return n;
}

uint64_t disk_bytes(const std::string& dir) {
  uint64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) n += disk_bytes_of(e.path().string());
  return n;
}

TEST(SsdStore, RestoreContinuesBitIdentically) {
  for (const char* name : {"gemma3-bf16", "qwen3_5-bf16"}) {  // rotating + kv; ssm + kv
    for (int bits : {0, 4}) {
      Fixture f(name, bits);
      auto store = f.store();
      const std::vector<int32_t> ids = testing::Reference::load(name).prompt("long");
      const std::vector<int32_t> prompt(ids.begin(), ids.begin() + 16);
      CacheList warm = f.prefill(prompt);
      ASSERT_TRUE(store->save(prompt, warm));
      // A longer request sharing the prompt: reuse all 16 tokens, run the rest.
      const std::vector<int32_t> request(ids.begin(), ids.begin() + 24);
      SsdStore::Restored r = store->restore(request);
      ASSERT_EQ(r.reused, 16) << name;
      const std::vector<int32_t> rest(request.begin() + 16, request.end());
      const Tensor a = f.model->forward(rest, warm, true);
      const Tensor b = f.model->forward(rest, r.caches, true);
      EXPECT_TRUE(kvtest::bit_identical(a, b)) << name << " bits " << bits;
      EXPECT_EQ(store->stats().hits, 1u);
    }
  }
}

TEST(SsdStore, LongestPrefixWinsAndTrimsWhenItCan) {
  Fixture f("qwen3-bf16");
  auto store = f.store();
  const std::string X = cache_namespace("", "x"), Y = cache_namespace("", "y");
  const std::vector<int32_t> a = seq(10), b = seq(30);
  ASSERT_TRUE(store->save(a, f.prefill(a), X));
  std::vector<int32_t> other = seq(20, 50);
  ASSERT_TRUE(store->save(other, f.prefill(other), X));
  EXPECT_EQ(store->lookup(b, X).reused, 10);
  EXPECT_EQ(store->lookup(seq(5), X).reused, 4);  // trimmed back to 4 tokens (one always runs)
  EXPECT_EQ(store->lookup(a, X).reused, 9);       // the same prompt: all but the last token
  EXPECT_EQ(store->lookup(b, Y).reused, 0);       // another namespace sees nothing
  EXPECT_EQ(store->lookup({7, 7, 7}, X).reused, 0);
  SsdStore::Restored r = store->restore(seq(5), X);
  ASSERT_EQ(r.reused, 4);
  for (const auto& c : r.caches) EXPECT_EQ(c->offset(), 4);
  // Only the 4 reused tokens' rows were read (the file holds 10): the restore's read and its estimate agree.
  const SsdStore::Match m = store->lookup(seq(5), X);
  EXPECT_EQ(r.bytes_read, store->stats().restore_bytes_last);
  EXPECT_GT(r.bytes_read, 0u);
  EXPECT_LT(r.bytes_read * 2, m.read_bytes * 10 / 4);  // under half of the whole file's tensor bytes
  EXPECT_LE(r.bytes_read, m.read_bytes);
  // The trimmed restore continues like a fresh prefill of those 4 tokens.
  CacheList fresh = f.prefill(seq(4));
  const Tensor x = f.model->forward({5}, fresh, false);
  const Tensor y = f.model->forward({5}, r.caches, false);
  EXPECT_TRUE(kvtest::bit_identical(x, y));
}

TEST(SsdStore, UntrimmableEntriesAreNotOfferedForShorterPrompts) {
  Fixture f("qwen3_5-bf16");  // ssm state cannot be trimmed
  auto store = f.store();
  const std::vector<int32_t> a = seq(12);
  ASSERT_TRUE(store->save(a, f.prefill(a)));
  EXPECT_EQ(store->lookup(seq(8)).reused, 0);
  EXPECT_EQ(store->lookup(seq(16)).reused, 12);
  EXPECT_EQ(store->lookup(a).reused, 0);  // would need the last token dropped
}

TEST(SsdStore, OneGrowingFilePerConversation) {
  Fixture f("qwen3-bf16");
  auto store = f.store();
  for (int n : {8, 16, 24, 32}) ASSERT_TRUE(store->save(seq(n), f.prefill(seq(n))));
  EXPECT_EQ(store->stats().entries, 1u);
  EXPECT_EQ(files_with(f.dir.path, ".lkv"), 1u);
  EXPECT_EQ(store->lookup(seq(40)).reused, 32);
  ASSERT_TRUE(store->save(seq(16), f.prefill(seq(16))));  // served by the stored extension: nothing written
  EXPECT_EQ(store->stats().spills, 4u);
  // A file of an untrimmable kind keeps its ancestors (they serve prompts it cannot).
  Fixture g("qwen3_5-bf16");
  auto s2 = g.store();
  ASSERT_TRUE(s2->save(seq(8), g.prefill(seq(8))));
  ASSERT_TRUE(s2->save(seq(16), g.prefill(seq(16))));
  EXPECT_EQ(s2->stats().entries, 2u);
}

TEST(SsdStore, CapOnDiskBytesIsNeverExceeded) {
  Fixture f("gemma3-bf16");
  uint64_t one = 0, bound = 0;
  {
    TempDir probe;
    const CacheList c = f.prefill(seq(20));
    save_kv_file(probe.path + "/p.lkv", seq(20), c, f.identity.meta);
    one = disk_bytes_of(probe.path + "/p.lkv");
    bound = kv_file_size_bound(seq(20), c, f.identity.meta);
  }
  const uint64_t cap = one + bound + 1;  // one file stored plus the reservation of the one being written
  auto store = f.store(cap);
  for (int i = 0; i < 8; ++i) {
    const std::vector<int32_t> ids = seq(20, 100 + 7 * i);
    EXPECT_TRUE(store->save(ids, f.prefill(ids)));
    EXPECT_LE(disk_bytes(f.dir.path), cap) << "after save " << i;
    EXPECT_LE(store->stats().bytes, cap);
  }
  EXPECT_GE(store->stats().entries, 1u);
  EXPECT_LE(store->stats().entries, 2u);
  // The most recently used entries survive: the last prompt is there (for a request extending it: gemma3's
  // wrapped rings cannot be trimmed).
  EXPECT_EQ(store->lookup(seq(21, 100 + 7 * 7)).reused, 20);
  // An entry larger than the cap is refused without writing.
  auto tiny = f.store(one / 2);
  EXPECT_FALSE(tiny->save(seq(20), f.prefill(seq(20))));
}

TEST(SsdStore, ScanRemovesOrphansAndCorruptFilesOfItsOwnIdentityOnly) {
  Fixture f("qwen3-bf16");
  std::string good_path, bad_path;
  {
    auto store = f.store();
    ASSERT_TRUE(store->save(seq(10), f.prefill(seq(10))));
    ASSERT_TRUE(store->save(seq(12, 40), f.prefill(seq(12, 40))));
    for (const auto& e : fs::recursive_directory_iterator(store->root()))
      if (e.is_regular_file()) (good_path.empty() ? good_path : bad_path) = e.path().string();
  }
  // Corrupt one file's header; leave a .tmp orphan; put files in another identity's folder.
  std::vector<uint8_t> bytes = kvtest::read_bytes(bad_path);
  bytes[40] ^= 0xff;
  kvtest::write_bytes(bad_path, bytes);
  const std::string root = f.dir.path + "/" + f.identity.key();
  kvtest::write_bytes(root + "/base/0000.lkv.tmp", {1, 2, 3});
  const std::string foreign = f.dir.path + "/ffffffffffffffffffffffffffffffff/base";
  fs::create_directories(foreign);
  kvtest::write_bytes(foreign + "/x.lkv", {9, 9});
  kvtest::write_bytes(foreign + "/y.lkv.tmp", {9});

  auto store = f.store();  // scans
  EXPECT_EQ(store->stats().entries, 1u);
  EXPECT_TRUE(fs::exists(good_path));
  EXPECT_FALSE(fs::exists(bad_path));
  EXPECT_FALSE(fs::exists(root + "/base/0000.lkv.tmp"));
  EXPECT_TRUE(fs::exists(foreign + "/x.lkv"));
  EXPECT_TRUE(fs::exists(foreign + "/y.lkv.tmp"));
  EXPECT_EQ(store->stats().removed_invalid, 1u);
}

TEST(SsdStore, CorruptTensorOnRestoreIsADeletedMiss) {
  Fixture f("qwen3-bf16");
  auto store = f.store(1ull << 30, /*verify=*/true);
  ASSERT_TRUE(store->save(seq(10), f.prefill(seq(10))));
  const std::string path = store->lookup(seq(11)).path;
  const KvFileHeader h = read_kv_header(path);
  std::vector<uint8_t> bytes = kvtest::read_bytes(path);
  bytes[h.data_start + h.caches[0].tensors[1].off + 3] ^= 0x10;
  kvtest::write_bytes(path, bytes);
  SsdStore::Restored r = store->restore(seq(11));
  EXPECT_EQ(r.reused, 0);
  ASSERT_EQ(r.caches.size(), f.layout.layers.size());
  for (const auto& c : r.caches) EXPECT_EQ(c->offset(), 0);
  EXPECT_FALSE(fs::exists(path));
  EXPECT_EQ(store->stats().misses, 1u);
  EXPECT_EQ(store->stats().entries, 0u);
}

TEST(SsdStore, FullDiskNeverThrowsAndLeavesNothing) {
  Fixture f("qwen3-bf16");
  auto store = f.store();
  CacheList caches = f.prefill(seq(64));
  {
    kvtest::FileSizeLimit limit(20000);
    EXPECT_FALSE(store->save(seq(64), caches));
    EXPECT_FALSE(store->save(seq(64, 3), f.prefill(seq(64, 3))));  // warned once, still no throw
  }
  EXPECT_EQ(files_with(f.dir.path, ".lkv"), 0u);
  EXPECT_EQ(files_with(f.dir.path, ".tmp"), 0u);
  EXPECT_EQ(store->stats().write_failures, 2u);
  EXPECT_EQ(store->stats().bytes, 0u);
  EXPECT_TRUE(store->save(seq(64), caches));  // the disk has room again
}

size_t ns_dirs(const std::string& root) {
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(root)) n += e.is_directory() ? 1 : 0;
  return n;
}

// Each cache_salt has a namespace folder: 60 salts left 48 empty folders behind for good.
TEST(SsdStore, NamespaceFoldersGoWithTheirLastFileAndScanSweepsEmptyOnes) {
  Fixture f("qwen3-bf16");
  const CacheList c = f.prefill(seq(10));
  uint64_t one = 0;
  {
    TempDir probe;
    save_kv_file(probe.path + "/p.lkv", seq(10), c, f.identity.meta);
    one = disk_bytes_of(probe.path + "/p.lkv");
  }
  auto store = f.store(3 * one + kv_file_size_bound(seq(10), c, f.identity.meta));
  for (int i = 0; i < 12; ++i) {
    ASSERT_TRUE(store->save(seq(10), c, cache_namespace("", "salt-" + std::to_string(i))));
    EXPECT_EQ(ns_dirs(store->root()), store->stats().entries) << "after save " << i;
  }
  EXPECT_LT(store->stats().entries, 12u);  // evictions happened
  // A failed restore deletes the file: its folder goes with it.
  const std::string ns = cache_namespace("", "salt-11");
  const std::string path = store->lookup(seq(11), ns).path;
  ASSERT_FALSE(path.empty());
  fs::resize_file(path, 10);
  EXPECT_EQ(store->restore(seq(11), ns).reused, 0);
  EXPECT_FALSE(fs::exists(fs::path(path).parent_path()));
  // A first write into a namespace that fails leaves no folder either.
  {
    kvtest::FileSizeLimit limit(100);
    EXPECT_FALSE(store->save(seq(10), c, cache_namespace("", "full-disk")));
  }
  EXPECT_EQ(ns_dirs(store->root()), store->stats().entries);
  store.reset();

  // At start, empty namespace folders (left by older versions) are swept; others, and other identities', stay.
  const std::string root = f.dir.path + "/" + f.identity.key();
  fs::create_directories(root + "/base");
  fs::create_directories(root + "/" + cache_namespace("", "old-salt"));
  fs::create_directories(root + "/not-a-namespace");
  const std::string foreign = f.dir.path + "/ffffffffffffffffffffffffffffffff/base";
  fs::create_directories(foreign);
  store = f.store();
  EXPECT_FALSE(fs::exists(root + "/base"));
  EXPECT_FALSE(fs::exists(root + "/" + cache_namespace("", "old-salt")));
  EXPECT_TRUE(fs::exists(root + "/not-a-namespace"));
  EXPECT_TRUE(fs::exists(foreign));
  EXPECT_EQ(ns_dirs(root), store->stats().entries + 1);
}

// A folder emptied by one thread (a failed restore) while a save writes into it: the save must still land.
TEST(SsdStore, EmptyingANamespaceNeverBreaksASaveIntoIt) {
  Fixture f("qwen3-bf16");
  auto store = f.store();
  const std::string ns = cache_namespace("", "busy");
  constexpr int kSaves = 60;
  std::vector<CacheList> caches;
  for (int k = 0; k < kSaves; ++k) caches.push_back(f.prefill(seq(6, 7 * k)));
  std::atomic<bool> done{false};
  std::thread spoiler([&] {
    const std::string dir = store->root() + "/" + ns;
    while (!done.load()) {
      std::error_code ec;
      for (fs::directory_iterator d(dir, ec), end; !ec && d != end; d.increment(ec))
        if (d->path().extension() == ".lkv") ::truncate(d->path().c_str(), 10);
      for (int k = 0; k < kSaves; ++k) store->restore(seq(7, 7 * k), ns);
    }
  });
  int stored = 0;
  for (int k = 0; k < kSaves; ++k) stored += store->save(seq(6, 7 * k), caches[static_cast<size_t>(k)], ns) ? 1 : 0;
  done = true;
  spoiler.join();
  EXPECT_EQ(stored, kSaves);
  EXPECT_EQ(store->stats().write_failures, 0u);
}

TEST(SsdStore, IdentitiesOfOtherModelsSchemesTokenizersTemplatesAndSaltsNeverMatch) {
  Fixture f("qwen3-bf16");
  const KvFileMeta base = f.identity.meta;
  // Another model of the same shape (quantized weights), another KV scheme, another dtype: other keys.
  auto q = load_model(testing::fixture_dir("qwen3-q8g32"));
  EXPECT_NE(cache_identity(*q, f.opts).meta.weights_hash, base.weights_hash);
  CacheOptions kv8;
  kv8.kv_bits = 8;
  EXPECT_NE(config_fingerprint(*f.model, kv8), base.config_fingerprint);
  // A copy of the checkpoint with another tokenizer, another template, or other weights of the same shape.
  TempDir copy;
  fs::copy(testing::fixture_dir("qwen3-bf16"), copy.path, fs::copy_options::recursive);
  auto again = load_model(copy.path);
  EXPECT_EQ(cache_identity(*again, f.opts).meta.weights_hash, base.weights_hash);
  EXPECT_EQ(tokenizer_hash(copy.path), base.tokenizer_hash);
  EXPECT_EQ(template_hash(copy.path), base.template_hash);
  {
    std::vector<uint8_t> t = kvtest::read_bytes(copy.path + "/tokenizer.json");
    t.push_back(' ');
    kvtest::write_bytes(copy.path + "/tokenizer.json", t);
  }
  EXPECT_NE(tokenizer_hash(copy.path), base.tokenizer_hash);
  EXPECT_EQ(template_hash(copy.path), base.template_hash);
  kvtest::write_bytes(copy.path + "/chat_template.jinja", {'x'});
  EXPECT_NE(template_hash(copy.path), base.template_hash);
  EXPECT_NE(template_hash(testing::fixture_dir("qwen3-bf16"), "{{ messages }}"), base.template_hash);
  {
    std::vector<uint8_t> w = kvtest::read_bytes(copy.path + "/model.safetensors");
    w[w.size() - 2] ^= 1;  // one weight byte in the last page
    kvtest::write_bytes(copy.path + "/model.safetensors", w);
  }
  EXPECT_NE(weights_hash(*load_model(copy.path)), base.weights_hash);
  // Salts and adapter sets are namespaces.
  EXPECT_EQ(cache_namespace("", ""), "");
  EXPECT_NE(cache_namespace("", "tenant-a"), cache_namespace("", "tenant-b"));
  EXPECT_NE(cache_namespace(adapter_set_hash({{"abc", 1.0}}), ""),
            cache_namespace(adapter_set_hash({{"abc", 0.5}}), ""));
  EXPECT_EQ(adapter_set_hash({}), "");

  // A store of another identity in the same DIR sees nothing of this one's files.
  auto store = f.store();
  ASSERT_TRUE(store->save(seq(10), f.prefill(seq(10)), cache_namespace("", "tenant-a")));
  EXPECT_EQ(store->lookup(seq(12), cache_namespace("", "tenant-b")).reused, 0);
  EXPECT_EQ(store->lookup(seq(12), cache_namespace("", "tenant-a")).reused, 10);
  CacheIdentity other = f.identity;
  other.meta.tokenizer_hash = "0";
  SsdStoreOptions o;
  o.dir = f.dir.path;
  o.max_bytes = 1ull << 30;
  SsdStore foreign(o, other, f.layout, [&] { return f.model->make_cache(f.opts); });
  EXPECT_EQ(foreign.scan().entries, 0u);
  EXPECT_EQ(foreign.lookup(seq(12), cache_namespace("", "tenant-a")).reused, 0);
  // A file of another identity moved into this identity's folder is refused by its header and deleted.
  const std::string moved = store->lookup(seq(12), cache_namespace("", "tenant-a")).path;
  KvFileMeta m = other.meta;
  m.ns = cache_namespace("", "tenant-a");
  save_kv_file(moved, seq(10), f.prefill(seq(10)), m);
  SsdStore::Restored r = store->restore(seq(12), cache_namespace("", "tenant-a"));
  EXPECT_EQ(r.reused, 0);
  EXPECT_FALSE(fs::exists(moved));
}

}  // namespace
}  // namespace lathe
