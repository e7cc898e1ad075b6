// The prompt-cache namespace of requests under LoRA adapters: it is the content hash of the adapter set (each
// adapter's factors and scale, in stacking order), never a mount id. The same adapter under another id, in
// another file layout or in another process keys the same; another adapter, another scale or another order
// does not; and through the scheduler an SSD entry written under one mount is restored under another.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cache/cache_identity.h"
#include "engine/scheduler.h"
#include "io/mapped_file.h"
#include "lora/adapter_manager.h"
#include "support/fixtures.h"
#include "support/kv_test_util.h"

namespace lathe {
namespace {

namespace fs = std::filesystem;

std::string adapter_dir(const std::string& name) { return test::fixtures_dir() + "/adapters/" + name; }

// A copy of a fixture adapter whose adapter_config.json says another scale.
std::string rescaled_copy(const std::string& name, double scale, const std::string& into) {
  const std::string dir = into + "/" + name + "-rescaled";
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(adapter_dir(name))) fs::copy_file(e.path(), dir / e.path().filename());
  nlohmann::json cfg = nlohmann::json::parse(read_text_file(dir + "/adapter_config.json"));
  cfg["lora_parameters"]["scale"] = scale;
  std::ofstream(dir + "/adapter_config.json", std::ios::trunc) << cfg.dump();
  return dir;
}

std::string key_of(lora::AdapterManager& m, const std::string& spec) { return m.resolve(spec).context().key; }

class AdapterCacheKeyTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { bundle_ = new ModelBundle(test::model_dir("qwen3-q4g64")); }
  static void TearDownTestSuite() { delete bundle_; }
  static ModelBundle* bundle_;
};
ModelBundle* AdapterCacheKeyTest::bundle_ = nullptr;

TEST_F(AdapterCacheKeyTest, TheKeyIsTheContentNeverTheId) {
  kvtest::TempDir tmp;
  lora::AdapterManager m(bundle_->model());
  m.mount("alpha", adapter_dir("qwen3-alpha"));
  m.mount("alpha-again", adapter_dir("qwen3-alpha"));
  m.mount("alpha-peft", adapter_dir("qwen3-alpha-peft"));  // the same factors in PEFT's layout
  m.mount("beta", adapter_dir("qwen3-beta"));
  m.mount("alpha-x3", rescaled_copy("qwen3-alpha", 3.0, tmp.path));

  const std::string alpha = key_of(m, "alpha");
  EXPECT_EQ(alpha.size(), 32u);
  EXPECT_EQ(key_of(m, "none"), "");
  EXPECT_EQ(key_of(m, ""), "");  // no default: the base
  EXPECT_EQ(key_of(m, "alpha-again"), alpha) << "another id, same content";
  EXPECT_EQ(key_of(m, "alpha-peft"), alpha) << "another file layout, same factors and scale";
  EXPECT_NE(key_of(m, "beta"), alpha);
  EXPECT_NE(key_of(m, "alpha-x3"), alpha) << "the same weights under another scale";
  EXPECT_EQ(key_of(m, "alpha+beta"), key_of(m, "alpha-again+beta"));
  EXPECT_EQ(key_of(m, "alpha,beta"), key_of(m, "alpha+beta"));
  EXPECT_NE(key_of(m, "alpha+beta"), key_of(m, "beta+alpha")) << "stacking order is part of the set";
  EXPECT_NE(key_of(m, "alpha+beta"), alpha);
  EXPECT_NE(key_of(m, "alpha+beta"), key_of(m, "beta"));

  // The listing carries the per-adapter hash; the same files hash the same in another manager (a restart).
  std::string listed;
  for (const auto& a : m.list())
    if (a.id == "alpha") listed = a.content_hash;
  EXPECT_EQ(listed.size(), 32u);
  lora::AdapterManager restarted(bundle_->model());
  restarted.mount("renamed", adapter_dir("qwen3-alpha"));
  EXPECT_EQ(restarted.list()[0].content_hash, listed);
  EXPECT_EQ(key_of(restarted, "renamed"), alpha);
  // Unmount and remount under the old id: still the same key (no mount serial in it).
  m.unmount("alpha");
  m.mount("alpha", adapter_dir("qwen3-alpha"));
  EXPECT_EQ(key_of(m, "alpha"), alpha);

  // Into namespaces: base, adapter and salt never collide.
  const std::string base_ns = cache_namespace("", ""), alpha_ns = cache_namespace(alpha, "");
  EXPECT_EQ(base_ns, "");
  EXPECT_EQ(alpha_ns.size(), 32u);
  EXPECT_NE(alpha_ns, cache_namespace(alpha, "tenant"));
  EXPECT_NE(alpha_ns, cache_namespace(key_of(m, "beta"), ""));
  EXPECT_NE(cache_namespace("", "tenant"), cache_namespace(alpha, "tenant"));
}

struct KeyRecorder : SequenceSink {
  std::vector<int32_t> ids;
  std::optional<GenerateResult> result;
  void on_token(const GeneratedToken& t) override {
    if (t.id >= 0) ids.push_back(t.id);
  }
  void on_finish(GenerateResult r) override { result = std::move(r); }
  std::string error;
  void on_error(std::exception_ptr e) override {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      error = x.what();
    }
  }
};

TEST_F(AdapterCacheKeyTest, AnSsdEntryServesTheSameAdapterUnderAnotherMountAndNoOtherSet) {
  kvtest::TempDir dir;
  auto store = [&] { return kvtest::open_ssd_store(*bundle_, dir.path); };
  auto scheduler = [&](SsdStore* ssd) {
    SchedulerOptions o;
    o.kv_cache_bytes = 1 << 30;
    o.prefill_chunk = 32;
    auto s = std::make_unique<Scheduler>(*bundle_, o);
    SsdTierOptions t;
    t.write_behind_s = 1000;  // only the explicit flush writes
    if (ssd) s->enable_ssd(*ssd, t);
    return s;
  };
  auto run = [](Scheduler& s, const std::vector<int32_t>& prompt, lora::AdapterManager* m, const std::string& spec) {
    GenerateOptions opt;
    opt.max_tokens = 6;
    opt.eos_ids = {-5};
    if (m) {
      const lora::Selection sel = m->resolve(spec);
      if (sel.slot >= 0) opt.adapters = std::make_shared<const lora::ForwardContext>(sel.context());
    }
    auto rec = std::make_shared<KeyRecorder>();
    s.add(prompt, opt, rec);
    for (int i = 0; i < 10000 && !s.idle(); ++i) s.step();
    EXPECT_TRUE(rec->result) << "the request finished: " << rec->error;
    return rec;
  };
  std::vector<int32_t> first;
  for (int k = 0; k < 60; ++k) first.push_back((7 + k * 11) % 600 + 1);
  std::vector<int32_t> next;
  {
    lora::AdapterManager m(bundle_->model());
    m.mount("alpha", adapter_dir("qwen3-alpha"));
    auto st = store();
    auto s = scheduler(st.get());
    next = first;
    const auto a = run(*s, first, &m, "alpha");
    next.insert(next.end(), a->ids.begin(), a->ids.end());
    for (int k = 0; k < 9; ++k) next.push_back(40 + k);
    s->flush_ssd();
    EXPECT_EQ(st->stats().entries, 1u);
  }
  // A restart: a fresh index and manager, the adapter mounted under another id.
  lora::AdapterManager m(bundle_->model());
  m.mount("renamed", adapter_dir("qwen3-alpha"));
  m.mount("beta", adapter_dir("qwen3-beta"));
  auto st = store();
  ASSERT_EQ(st->stats().entries, 1u);
  auto s = scheduler(st.get());
  const int reused = static_cast<int>(first.size() + 6 - 1);
  // Neither the base model nor another set sees the entry.
  for (const std::string spec : {"none", "beta", "renamed+beta"}) {
    auto r = run(*s, next, &m, spec);
    EXPECT_EQ(r->result->cached_tokens, 0) << spec;
    EXPECT_EQ(r->ids, run(*scheduler(nullptr), next, &m, spec)->ids) << spec << ": the cold output";
  }
  EXPECT_EQ(s->cache_stats().ssd_hits, 0);
  auto hit = run(*s, next, &m, "renamed");
  EXPECT_EQ(hit->result->cached_tokens, reused);
  EXPECT_EQ(s->cache_stats().ssd_hits, 1);
  auto cold = run(*scheduler(nullptr), next, &m, "renamed");
  EXPECT_EQ(cold->result->cached_tokens, 0);
  EXPECT_EQ(hit->ids, cold->ids) << "restored under the new id: the cold output";
  auto base = run(*scheduler(nullptr), next, nullptr, "");
  EXPECT_NE(hit->ids, base->ids) << "the adapter changes the output (else this test proves nothing)";
}

}  // namespace
}  // namespace lathe
