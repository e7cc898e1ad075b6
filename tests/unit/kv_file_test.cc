// KV file format v2: save -> load into fresh caches -> continued decode is bit-identical to never having saved,
// for every cache kind on every fixture model; flipped bytes, crafted headers and truncations are refused with
// an error; an injected write failure leaves no file behind.
#include <signal.h>
#include <sys/resource.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include <gtest/gtest.h>

#include "cache/content_hash.h"
#include "cache/kv_file.h"
#include "common/error.h"
#include "common/fixture_reference.h"
#include "model/model.h"
#include "support/kv_test_util.h"

namespace lathe {
namespace {

namespace fs = std::filesystem;
using kvtest::bit_identical;
using kvtest::read_bytes;
using kvtest::TempDir;
using kvtest::write_bytes;

struct KvFileCase {
  std::string model;
  int kv_bits;
};

std::vector<KvFileCase> all_cases() {
  std::vector<KvFileCase> out;
  for (const auto& d : fs::directory_iterator(test::fixtures_dir() + "/models")) {
    if (!fs::exists(d.path() / "reference.json")) continue;
    for (int bits : {0, 8}) out.push_back({d.path().filename().string(), bits});
  }
  std::sort(out.begin(), out.end(), [](const KvFileCase& a, const KvFileCase& b) {
    return a.model != b.model ? a.model < b.model : a.kv_bits < b.kv_bits;
  });
  return out;
}

std::vector<std::string> all_models() {
  std::vector<std::string> out;
  for (const KvFileCase& c : all_cases())
    if (out.empty() || out.back() != c.model) out.push_back(c.model);
  return out;
}

// Prefill past the sliding window (rings wrap), decode a few tokens, save; load into fresh caches and decode
// the same continuation on both.
void round_trip(const KvFileCase& c) {
  auto model = load_model(testing::fixture_dir(c.model));
  const std::vector<int32_t> ids = testing::Reference::load(c.model).prompt("long");
  CacheOptions opts;
  opts.kv_bits = c.kv_bits;
  opts.kv_group_size = 32;
  CacheList caches = model->make_cache(opts);
  model->forward({ids.begin(), ids.begin() + 20}, caches, false);
  for (size_t i = 20; i < 23; ++i) model->forward({ids[i]}, caches, false);
  const std::vector<int32_t> prefix(ids.begin(), ids.begin() + 23);

  TempDir dir;
  const std::string path = dir.path + "/a.lkv";
  KvFileMeta meta;
  meta.model_id = c.model;
  const uint64_t size = save_kv_file(path, prefix, caches, meta);
  EXPECT_EQ(size, fs::file_size(path));
  EXPECT_LE(size, kv_file_size_bound(prefix, caches, meta));
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  const CacheLayout layout = probe_cache_layout(*model, opts);
  CacheList restored = model->make_cache(opts);
  KvLoadOptions lo;
  lo.expect = &meta;
  lo.verify = true;
  const KvFileHeader h = load_kv_file(path, layout, restored, lo);
  EXPECT_EQ(h.tokens, prefix);
  for (size_t i = 0; i < caches.size(); ++i) {
    EXPECT_EQ(restored[i]->offset(), caches[i]->offset());
    EXPECT_STREQ(restored[i]->kind(), caches[i]->kind());
  }
  // Saving the restored caches gives the same tensors (hashes) again.
  const std::string again = dir.path + "/b.lkv";
  save_kv_file(again, prefix, restored, meta);
  const KvFileHeader h2 = read_kv_header(again);
  ASSERT_EQ(h2.caches.size(), h.caches.size());
  for (size_t i = 0; i < h.caches.size(); ++i)
    for (size_t t = 0; t < h.caches[i].tensors.size(); ++t)
      EXPECT_EQ(h2.caches[i].tensors[t].hash, h.caches[i].tensors[t].hash) << "cache " << i << " tensor " << t;

  for (size_t i = 23; i < 28; ++i) {
    const Tensor a = model->forward({ids[i]}, caches, false);
    const Tensor b = model->forward({ids[i]}, restored, false);
    ASSERT_TRUE(bit_identical(a, b)) << c.model << " kv_bits " << c.kv_bits << " step " << i;
  }
  const Tensor a = model->forward({ids.begin() + 28, ids.begin() + 32}, caches, true);
  const Tensor b = model->forward({ids.begin() + 28, ids.begin() + 32}, restored, true);
  EXPECT_TRUE(bit_identical(a, b)) << "prefill chunk after restore";
}

class KvFileRoundTrip : public ::testing::TestWithParam<std::string> {};

// f32 caches (kv, rotating, ssm) and 8-bit ones (qkv, rotating-qkv, ssm) of one fixture model.
TEST_P(KvFileRoundTrip, ContinuesBitIdentically) {
  for (int bits : {0, 8}) round_trip({GetParam(), bits});
}

INSTANTIATE_TEST_SUITE_P(FixtureModels, KvFileRoundTrip, ::testing::ValuesIn(all_models()),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string n = i.param;
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

TEST(KvFile, EveryCacheKindIsCovered) {
  std::set<std::string> kinds;
  for (const KvFileCase& c : all_cases()) {
    TempDir dir;
    auto model = load_model(testing::fixture_dir(c.model));
    CacheOptions opts;
    opts.kv_bits = c.kv_bits;
    opts.kv_group_size = 32;
    CacheList caches = model->make_cache(opts);
    model->forward(std::vector<int32_t>{1, 2, 3}, caches, false);
    save_kv_file(dir.path + "/f.lkv", {1, 2, 3}, caches, {});
    for (const auto& e : read_kv_header(dir.path + "/f.lkv").caches) kinds.insert(e.kind);
  }
  EXPECT_EQ(kinds, (std::set<std::string>{"kv", "rotating", "qkv", "rotating-qkv", "ssm"}));
}

// A saved gemma4 file (kv + rotating caches; 2 tensors each) for the fault tests.
struct Saved {
  std::unique_ptr<Model> model;
  CacheLayout layout;
  TempDir dir;
  std::string path;
  std::vector<int32_t> tokens;
  KvFileHeader header;
};

std::unique_ptr<Saved> save_one(const std::string& name = "gemma4-bf16", int kv_bits = 0) {
  auto s = std::make_unique<Saved>();
  s->model = load_model(testing::fixture_dir(name));
  CacheOptions o;
  o.kv_bits = kv_bits;
  o.kv_group_size = 32;
  s->layout = probe_cache_layout(*s->model, o);
  const std::vector<int32_t> ids = testing::Reference::load(name).prompt("long");
  s->tokens.assign(ids.begin(), ids.begin() + 12);
  CacheList caches = s->model->make_cache(o);
  s->model->forward(s->tokens, caches, false);
  s->path = s->dir.path + "/x.lkv";
  save_kv_file(s->path, s->tokens, caches, {});
  s->header = read_kv_header(s->path);
  return s;
}

TEST(KvFile, EveryFlippedHeaderByteIsCaught) {
  auto s = save_one();
  const std::vector<uint8_t> good = read_bytes(s->path);
  const size_t header_end = kKvFilePrefixBytes + s->header.header_bytes;
  int caught = 0;
  for (size_t i = 0; i < header_end; ++i) {
    std::vector<uint8_t> bad = good;
    bad[i] ^= 0x20;
    EXPECT_THROW(parse_kv_header(bad.data(), bad.size(), bad.size()), Error) << "byte " << i;
    ++caught;
  }
  EXPECT_EQ(caught, static_cast<int>(header_end));
  // The same through the file path (load), for a byte in the JSON.
  std::vector<uint8_t> bad = good;
  bad[kKvFilePrefixBytes + 5] ^= 1;
  write_bytes(s->path, bad);
  CacheList fresh = s->model->make_cache();
  try {
    load_kv_file(s->path, s->layout, fresh);
    FAIL() << "a corrupt header loaded";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Corrupt);
    EXPECT_NE(std::string(e.what()).find("header hash mismatch"), std::string::npos) << e.what();
  }
}

TEST(KvFile, FlippedTensorBytesAreCaughtWithVerify) {
  auto s = save_one("qwen3_5-bf16");  // ssm + kv tensors
  const std::vector<uint8_t> good = read_bytes(s->path);
  std::mt19937 rng(7);
  for (size_t c = 0; c < s->header.caches.size(); ++c)
    for (const KvTensorSlot& t : s->header.caches[c].tensors) {
      std::vector<uint8_t> bad = good;
      const uint64_t at = s->header.data_start + t.off + rng() % t.bytes;
      bad[at] ^= static_cast<uint8_t>(1u << (rng() % 8));
      write_bytes(s->path, bad);
      CacheList fresh = s->model->make_cache();
      KvLoadOptions verify;
      verify.verify = true;
      try {
        load_kv_file(s->path, s->layout, fresh, verify);
        ADD_FAILURE() << "a flipped byte at " << at << " loaded with verify on";
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::Corrupt);
        EXPECT_NE(std::string(e.what()).find("tensor hash mismatch"), std::string::npos);
      }
      EXPECT_THROW(verify_kv_file(s->path), Error);
    }
  write_bytes(s->path, good);
  EXPECT_NO_THROW(verify_kv_file(s->path));
}

TEST(KvFile, TruncatedFilesAreRefused) {
  auto s = save_one();
  const std::vector<uint8_t> good = read_bytes(s->path);
  for (size_t n :
       {size_t{0}, size_t{5}, size_t{23}, size_t{24}, size_t{100}, size_t{s->header.data_start}, good.size() - 1}) {
    write_bytes(s->path, std::vector<uint8_t>(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n)));
    CacheList fresh = s->model->make_cache();
    EXPECT_THROW(load_kv_file(s->path, s->layout, fresh), Error) << n << " bytes";
    EXPECT_THROW(read_kv_header(s->path), Error) << n << " bytes";
  }
}

// Crafted headers with a valid hash: the checks behind the hash hold on their own.
TEST(KvFile, CraftedHeadersGiveClearErrors) {
  auto s = save_one();
  const std::vector<uint8_t> good = read_bytes(s->path);
  const std::string body(good.begin() + kKvFilePrefixBytes,
                         good.begin() + static_cast<std::ptrdiff_t>(kKvFilePrefixBytes + s->header.header_bytes));
  const nlohmann::json base = nlohmann::json::parse(body);
  auto expect_refused = [&](nlohmann::json j, const std::string& needle) {
    const std::vector<uint8_t> f = kvtest::with_header(good, s->header.data_start, j.dump());
    try {
      parse_kv_header(f.data(), f.size(), f.size());
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  {  // the untouched header re-framed parses (the helper is right)
    const std::vector<uint8_t> f = kvtest::with_header(good, s->header.data_start, base.dump());
    EXPECT_NO_THROW(parse_kv_header(f.data(), f.size(), f.size()));
  }
  nlohmann::json j = base;
  j["caches"][0]["kind"] = "paged";
  expect_refused(j, "caches[0].kind");
  j = base;
  j["caches"][0]["tensors"][0]["bytes"] = 12;
  expect_refused(j, "caches[0].tensors[0].bytes");
  j = base;
  j["caches"][0]["tensors"][1]["off"] = j["caches"][0]["tensors"][0]["off"];
  expect_refused(j, "overlap");
  j = base;
  j["caches"][0]["tensors"][0]["off"] = 1ull << 40;
  expect_refused(j, "past the end");
  j = base;
  j["caches"][0]["tensors"][0]["off"] = 100;
  expect_refused(j, "16 KiB");
  j = base;
  j["caches"][0]["tensors"][0]["shape"] = {1, 2, 3, 4, 5};
  expect_refused(j, "shape");
  j = base;
  j["caches"][0]["tensors"][0]["shape"][0] = -1;
  expect_refused(j, "shape[0]");
  j = base;
  j["caches"][0]["offset"] = 3;
  expect_refused(j, "caches[0].offset");
  j = base;
  j["tokens"][0] = "x";
  expect_refused(j, "tokens");
  j = base;
  j["formatVersion"] = 3;
  expect_refused(j, "formatVersion 3");
  j = base;
  j["surprise"] = 1;
  expect_refused(j, "unknown field 'surprise'");
  size_t ring = 0;
  while (ring < s->header.caches.size() && s->header.caches[ring].kind != "rotating") ++ring;
  ASSERT_LT(ring, s->header.caches.size());
  j = base;
  j["caches"][ring]["idx"] = 999;
  expect_refused(j, "caches[" + std::to_string(ring) + "].idx");
  j = base;
  j["caches"][ring].erase("maxSize");
  expect_refused(j, "maxSize");
  j = base;
  j["caches"][0]["tensors"][0]["dtype"] = "Q7";
  expect_refused(j, "dtype");
  j = base;
  j.erase("ns");
  expect_refused(j, "missing field 'ns'");
  j = base;
  nlohmann::json deep = 1;
  for (int i = 0; i < 20; ++i) deep = nlohmann::json::array({deep});
  j["modelId"] = deep;
  expect_refused(j, "nested deeper");
  // Not JSON at all.
  const std::vector<uint8_t> f = kvtest::with_header(good, s->header.data_start, "{\"formatVersion\": 2, ");
  EXPECT_THROW(parse_kv_header(f.data(), f.size(), f.size()), Error);
}

TEST(KvFile, FileOfAnotherLayoutIsRefusedBeforeRestoring) {
  auto s = save_one("gemma4-bf16");
  auto other = load_model(testing::fixture_dir("qwen3-bf16"));
  const CacheLayout layout = probe_cache_layout(*other, {});
  CacheList fresh = other->make_cache();
  try {
    load_kv_file(s->path, layout, fresh);
    FAIL() << "a gemma4 file restored into qwen3";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("caches, this model has"), std::string::npos) << e.what();
  }
  // Same model, another KV scheme: the kind differs.
  CacheOptions q;
  q.kv_bits = 8;
  q.kv_group_size = 32;
  const CacheLayout qlayout = probe_cache_layout(*s->model, q);
  CacheList qfresh = s->model->make_cache(q);
  EXPECT_THROW(load_kv_file(s->path, qlayout, qfresh), Error);
}

TEST(KvFile, MetadataMismatchNamesTheField) {
  auto s = save_one();
  KvFileMeta want;  // the file was saved with empty metadata
  want.template_hash = "abc";
  KvLoadOptions o;
  o.expect = &want;
  CacheList fresh = s->model->make_cache();
  try {
    load_kv_file(s->path, s->layout, fresh, o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("templateHash"), std::string::npos) << e.what();
  }
}

// Restoring only a file's first tokens (KvLoadOptions::tokens) reads only their rows, and gives exactly the
// caches a whole restore trimmed to them gives: the same state bytes and the same continued logits. Files whose
// caches cannot drop tokens (a wrapped ring, SSM state) refuse a partial restore rather than restore wrongly.
TEST(KvFile, PrefixRestoreEqualsWholeRestoreTrimmed) {
  int partial = 0, refused = 0;
  for (const KvFileCase& c : all_cases()) {
    auto model = load_model(testing::fixture_dir(c.model));
    CacheOptions o;
    o.kv_bits = c.kv_bits;
    o.kv_group_size = 32;
    const std::vector<int32_t> ids = testing::Reference::load(c.model).prompt("long");
    const std::vector<int32_t> stored(ids.begin(), ids.begin() + 12);
    CacheList caches = model->make_cache(o);
    model->forward(stored, caches, false);
    TempDir dir;
    const std::string path = dir.path + "/p.lkv";
    const uint64_t file_bytes = save_kv_file(path, stored, caches, {});
    const CacheLayout layout = probe_cache_layout(*model, o);
    const KvFileHeader h = read_kv_header(path);
    const std::string what = c.model + " kv_bits " + std::to_string(c.kv_bits);
    KvLoadOptions lo;
    lo.tokens = 7;
    KvLoadStats st;
    lo.stats = &st;
    CacheList part = model->make_cache(o);
    if (!h.trimmable()) {
      try {
        load_kv_file(path, layout, part, lo);
        ADD_FAILURE() << what << ": a partial restore of an untrimmable file";
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument) << what;
      }
      ++refused;
      continue;
    }
    load_kv_file(path, layout, part, lo);
    EXPECT_LT(st.bytes_read, file_bytes) << what;
    CacheList whole = model->make_cache(o);
    KvLoadStats ws;
    KvLoadOptions wo;
    wo.verify = true;
    wo.stats = &ws;
    load_kv_file(path, layout, whole, wo);
    EXPECT_GT(ws.bytes_read, st.bytes_read) << what;
    for (const auto& w : whole) w->trim(w->offset() - 7);
    for (size_t i = 0; i < whole.size(); ++i) {
      ASSERT_EQ(part[i]->offset(), 7) << what;
      const CacheState a = part[i]->state(), b = whole[i]->state();
      ASSERT_EQ(a.tensors.size(), b.tensors.size()) << what;
      for (size_t t = 0; t < a.tensors.size(); ++t)
        EXPECT_TRUE(bit_identical(a.tensors[t].second, b.tensors[t].second)) << what << " cache " << i;
    }
    for (size_t i = 7; i < 10; ++i) {
      const Tensor a = model->forward({ids[i]}, part, false);
      const Tensor b = model->forward({ids[i]}, whole, false);
      ASSERT_TRUE(bit_identical(a, b)) << what << " step " << i;
    }
    ++partial;
  }
  EXPECT_GT(partial, 0);
  EXPECT_GT(refused, 0);  // the SSM fixtures
  // Out of range: nothing, or more than the file holds.
  auto s = save_one("qwen3-bf16");
  for (int64_t n : {int64_t{0}, static_cast<int64_t>(s->tokens.size()) + 1}) {
    KvLoadOptions lo;
    lo.tokens = n;
    CacheList fresh = s->model->make_cache();
    EXPECT_THROW(load_kv_file(s->path, s->layout, fresh, lo), Error) << n;
  }
}

TEST(KvFile, RefusesCachesThatDoNotHoldTheTokens) {
  auto model = load_model(testing::fixture_dir("qwen3-bf16"));
  CacheList caches = model->make_cache();
  model->forward(std::vector<int32_t>{1, 2, 3}, caches, false);
  TempDir dir;
  EXPECT_THROW(save_kv_file(dir.path + "/a.lkv", {1, 2}, caches, {}), Error);
  EXPECT_THROW(save_kv_file(dir.path + "/a.lkv", {}, caches, {}), Error);
  EXPECT_TRUE(fs::is_empty(dir.path));
}

// A disk that refuses mid-write (RLIMIT_FSIZE makes write() fail with EFBIG, as a full disk fails with
// ENOSPC): an Io error, and neither the final name nor the .tmp is left.
TEST(KvFile, WriteFailureLeavesNoFile) {
  auto model = load_model(testing::fixture_dir("qwen3-bf16"));
  CacheList caches = model->make_cache();
  std::vector<int32_t> ids(64);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i + 1);
  model->forward(ids, caches, false);
  TempDir dir;
  const std::string path = dir.path + "/a.lkv";
  {
    kvtest::FileSizeLimit limit(20000);  // past the header page, inside the first tensor
    try {
      save_kv_file(path, ids, caches, {});
      FAIL() << "the write did not fail";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Io) << e.what();
    }
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_NO_THROW(save_kv_file(path, ids, caches, {}));  // and with room it works
}

}  // namespace
}  // namespace lathe
