// LoRA adapter files (mlx-lm and PEFT), the AdapterManager (mount validation, specs, unmount) and the residual
// op with per-token slots, on the fixture adapters and on adapters written by the tests.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "common/os_error.h"
#include "io/safetensors.h"
#include "lora/adapter_file.h"
#include "lora/adapter_manager.h"
#include "lora/batch_scope.h"
#include "lora/cpu_residual.h"
#include "model/model.h"
#include "support/fixtures.h"
#include "support/test_dir.h"
#include "tensor/ops.h"

namespace lathe {
namespace {

namespace fs = std::filesystem;
std::string adapters_dir(const std::string& name) { return test::fixtures_dir() + "/adapters/" + name; }

// A scratch directory per test, removed at the end.
// A per-test directory under the temp dir.
struct ScratchDir : testutil::TestDir {
  ScratchDir() : TestDir("lora") {}
};

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// Writes an mlx-lm adapter with the given tensors (name -> shape, filled with small values).
void write_mlx(const std::string& dir, const std::vector<std::pair<std::string, Shape>>& tensors, int rank,
               double scale = 1.0) {
  fs::create_directories(dir);
  write_text(dir + "/adapter_config.json", "{\"fine_tune_type\": \"lora\", \"lora_parameters\": {\"rank\": " +
                                               std::to_string(rank) + ", \"scale\": " + std::to_string(scale) + "}}");
  SafetensorsWriter w;
  for (const auto& [name, shape] : tensors) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    for (size_t i = 0; i < v.size(); ++i) v[i] = 0.01f * static_cast<float>((i * 7) % 13) - 0.06f;
    w.add(name, Tensor::from_floats(v, shape));
  }
  w.write(dir + "/adapters.safetensors");
}

// Sites of a 2-layer model like the qwen3 fixtures (hidden 64, q 64, kv 32, intermediate 128).
std::shared_ptr<lora::LinearSites> qwen3_like_sites() {
  auto s = std::make_shared<lora::LinearSites>();
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    s->add(p + ".self_attn.q_proj", 64, 64);
    s->add(p + ".self_attn.k_proj", 32, 64);
    s->add(p + ".self_attn.v_proj", 32, 64);
    s->add(p + ".self_attn.o_proj", 64, 64);
    s->add(p + ".mlp.gate_proj", 128, 64);
    s->add(p + ".mlp.up_proj", 128, 64);
    s->add(p + ".mlp.down_proj", 64, 128);
  }
  return s;
}

TEST(LoraFiles, MlxAndPeftLayoutsGiveTheSameFactors) {
  const auto mlx = lora::read_adapter(adapters_dir("qwen3-alpha"));
  const auto peft = lora::read_adapter(adapters_dir("qwen3-alpha-peft"));
  EXPECT_EQ(mlx.config.format, "mlx-lm");
  EXPECT_EQ(peft.config.format, "peft");
  EXPECT_EQ(mlx.config.rank, 4);
  EXPECT_FLOAT_EQ(mlx.config.scale, 2.0f);
  EXPECT_FLOAT_EQ(peft.config.scale, 2.0f);  // lora_alpha 8 / r 4
  EXPECT_EQ(lora::base_model_name(peft.config.base_model), "org/qwen3-q4g64");
  ASSERT_EQ(mlx.factors.size(), 6u);
  ASSERT_EQ(peft.factors.size(), 6u);
  for (size_t i = 0; i < mlx.factors.size(); ++i) {
    const auto &m = mlx.factors[i], &p = peft.factors[i];
    EXPECT_EQ(m.module, p.module);
    EXPECT_EQ(m.a.shape(), p.a.shape());
    EXPECT_EQ(m.b.shape(), p.b.shape());
    EXPECT_EQ(m.a.to_floats(), p.a.to_floats()) << m.module;
    EXPECT_EQ(m.b.to_floats(), p.b.to_floats()) << m.module;
    EXPECT_FLOAT_EQ(m.scale, p.scale);
  }
  EXPECT_EQ(mlx.factors[0].module, "model.layers.0.mlp.down_proj");
  EXPECT_EQ(mlx.factors[0].a.shape(), (Shape{4, 128}));  // [r, in]
  EXPECT_EQ(mlx.factors[0].b.shape(), (Shape{64, 4}));   // [out, r]
}

TEST(LoraFiles, PeftScaleRsLoraAndPatterns) {
  ScratchDir t;
  const std::string d = t.str() + "/p";
  fs::create_directories(d);
  write_text(d + "/adapter_config.json",
             R"({"peft_type":"LORA","r":4,"lora_alpha":8,"use_rslora":true,"rank_pattern":{"v_proj":2},)"
             R"("alpha_pattern":{"model.layers.0.self_attn.v_proj":6}})");
  SafetensorsWriter w;
  w.add("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", Tensor::zeros({4, 64}, DType::F32));
  w.add("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", Tensor::zeros({64, 4}, DType::F32));
  w.add("base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight", Tensor::zeros({2, 64}, DType::F32));
  w.add("base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight", Tensor::zeros({32, 2}, DType::F32));
  w.add("base_model.model.lm_head.modules_to_save.weight", Tensor::zeros({8, 64}, DType::F32));
  w.write(d + "/adapter_model.safetensors");
  const auto a = lora::read_adapter(d);
  ASSERT_EQ(a.factors.size(), 2u);
  EXPECT_EQ(a.skipped, 1u);
  EXPECT_FLOAT_EQ(a.factors[0].scale, 8.0f / 2.0f);             // q: alpha 8 / sqrt(4)
  EXPECT_FLOAT_EQ(a.factors[1].scale, 6.0f / std::sqrt(2.0f));  // v: alpha 6 / sqrt(2)
}

TEST(LoraFiles, HalfPairTransposedAndCorruptFilesAreSpecificErrors) {
  ScratchDir t;
  write_mlx(t.str() + "/half", {{"model.layers.0.self_attn.q_proj.lora_a", {64, 4}}}, 4);
  try {
    lora::read_adapter(t.str() + "/half");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Corrupt);
    EXPECT_NE(std::string(e.what()).find("model.layers.0.self_attn.q_proj"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("B (up) half"), std::string::npos) << e.what();
  }
  // A PEFT A stored as [in, r]: the rank dimensions no longer line up.
  const std::string d = t.str() + "/tr";
  fs::create_directories(d);
  write_text(d + "/adapter_config.json", R"({"peft_type":"LORA","r":4,"lora_alpha":8})");
  SafetensorsWriter w;
  w.add("base_model.model.model.layers.0.mlp.down_proj.lora_A.weight", Tensor::zeros({128, 4}, DType::F32));
  w.add("base_model.model.model.layers.0.mlp.down_proj.lora_B.weight", Tensor::zeros({64, 4}, DType::F32));
  w.write(d + "/adapter_model.safetensors");
  try {
    lora::read_adapter(d);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Corrupt);
    EXPECT_NE(std::string(e.what()).find("transposed"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[128, 4]"), std::string::npos) << e.what();
  }
  // A truncated weights file.
  const std::string c = t.str() + "/corrupt";
  fs::create_directories(c);
  fs::copy_file(adapters_dir("qwen3-beta") + "/adapter_config.json", c + "/adapter_config.json");
  {
    std::ifstream in(adapters_dir("qwen3-beta") + "/adapters.safetensors", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    std::ofstream(c + "/adapters.safetensors", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  }
  try {
    lora::read_adapter(c);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Corrupt) << e.what();
    EXPECT_NE(std::string(e.what()).find("adapters.safetensors"), std::string::npos) << e.what();
  }
  EXPECT_THROW(lora::read_adapter(t.str() + "/missing"), Error);
}

// A NaN or infinity in a factor mounted fine and then made every output of the adapter empty.
TEST(LoraFiles, NonFiniteFactorsAreRefusedNamingTheTensor) {
  ScratchDir t;
  const std::string a = "model.layers.0.self_attn.q_proj.lora_a", b = "model.layers.0.self_attn.q_proj.lora_b";
  for (const float bad : {std::nanf(""), INFINITY, -INFINITY}) {
    for (const DType dtype : {DType::F32, DType::BF16, DType::F16}) {
      const std::string d = t.str() + "/bad";
      fs::remove_all(d);
      fs::create_directories(d);
      write_text(d + "/adapter_config.json",
                 R"({"fine_tune_type": "lora", "lora_parameters": {"rank": 4, "scale": 2.0}})");
      std::vector<float> va(64 * 4, 0.01f), vb(4 * 64, 0.02f);
      vb[37] = bad;
      SafetensorsWriter w;
      w.add(a, Tensor::from_floats(va, {64, 4}).to(dtype));
      w.add(b, Tensor::from_floats(vb, {4, 64}).to(dtype));
      w.write(d + "/adapters.safetensors");
      try {
        lora::read_adapter(d);
        ADD_FAILURE() << "accepted " << bad << " as " << dtype_name(dtype);
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::Corrupt);
        EXPECT_NE(std::string(e.what()).find("tensor '" + b + "'"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("NaN or infinite value (element 37)"), std::string::npos) << e.what();
      }
    }
  }
}

// Only a missing file is "not found": a config that cannot be looked at is an OsError with its errno (EACCES is a
// permission error to the server, not a 404), and names the path.
TEST(LoraFiles, ACheckThatFailsForAnotherReasonThanAbsenceIsAnOsErrorNotNotFound) {
  ScratchDir t;
  // Absent (ENOENT), or under a path whose component is a file (ENOTDIR): NotFound, as before.
  for (const std::string& dir : {t.str("missing"), t.str("plain/sub")}) {
    if (dir == t.str("plain/sub")) write_text(t.str("plain"), "x");
    try {
      lora::read_adapter_config(dir);
      ADD_FAILURE() << dir;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::NotFound) << e.what();
      EXPECT_EQ(dynamic_cast<const OsError*>(&e), nullptr) << e.what();
    }
  }
  // A symlink loop where the config should be: ELOOP, naming it.
  const std::string loop = t.str("loop");
  fs::create_directories(loop);
  fs::create_symlink("adapter_config.json", loop + "/adapter_config.json");
  try {
    lora::read_adapter_config(loop);
    ADD_FAILURE() << "nothing thrown";
  } catch (const OsError& e) {
    EXPECT_EQ(e.os_errno(), ELOOP) << e.what();
    EXPECT_EQ(std::string(e.what()), loop + "/adapter_config.json: " + std::strerror(ELOOP));
  }
  // An adapter whose folder may not be searched (root may search any): EACCES, not "no adapter_config.json".
  if (::geteuid() == 0) return;
  const std::string locked = t.str("locked");
  write_mlx(locked, {{"model.layers.0.self_attn.q_proj.lora_a", {64, 4}}}, 4);
  fs::permissions(locked, fs::perms::owner_read | fs::perms::owner_write);  // 0600: no search
  try {
    lora::read_adapter_config(locked);
    ADD_FAILURE() << "nothing thrown";
  } catch (const OsError& e) {
    EXPECT_EQ(e.os_errno(), EACCES) << e.what();
    EXPECT_EQ(e.kind(), ErrorKind::Io);
    EXPECT_EQ(std::string(e.what()), locked + "/adapter_config.json: " + std::strerror(EACCES));
  }
  fs::permissions(locked, fs::perms::owner_all);  // so that the folder can be removed
}

TEST(LoraManager, MountValidatesAgainstTheBaseAllOrNothing) {
  lora::AdapterManager m(qwen3_like_sites(), Device::CPU, DType::F32);
  // gemma3-alpha has 3 layers: layer 2 is not in a 2-layer base.
  try {
    m.mount("g", adapters_dir("gemma3-alpha"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("model.layers.2."), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("another base model"), std::string::npos) << e.what();
  }
  // Right layers, wrong shapes: the message names the module and both shapes.
  ScratchDir t;
  write_mlx(t.str() + "/wide",
            {{"model.layers.0.self_attn.q_proj.lora_a", {64, 4}},
             {"model.layers.0.self_attn.q_proj.lora_b", {4, 64}},
             {"model.layers.1.mlp.down_proj.lora_a", {256, 4}},
             {"model.layers.1.mlp.down_proj.lora_b", {4, 64}}},
            4);
  try {
    m.mount("wide", t.str() + "/wide");
    FAIL();
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("model.layers.1.mlp.down_proj"), std::string::npos) << w;
    EXPECT_NE(w.find("[64, 256]"), std::string::npos) << w;
    EXPECT_NE(w.find("[64, 128]"), std::string::npos) << w;
  }
  EXPECT_TRUE(m.list().empty());  // nothing half-mounted
  EXPECT_FALSE(m.mounted("wide"));
  const auto info = m.mount("alpha", adapters_dir("qwen3-alpha"));
  EXPECT_EQ(info.modules, 6u);
  EXPECT_EQ(info.rank, 4);
  EXPECT_THROW(m.mount("alpha", adapters_dir("qwen3-beta")), Error);  // id taken
  EXPECT_THROW(m.mount("a+b", adapters_dir("qwen3-beta")), Error);
  EXPECT_THROW(m.mount("a,b", adapters_dir("qwen3-beta")), Error);
  EXPECT_THROW(m.mount("none", adapters_dir("qwen3-beta")), Error);
}

TEST(LoraManager, SpecsResolveToSlotsAndUnmountDropsThem) {
  lora::AdapterManager m(qwen3_like_sites(), Device::CPU, DType::F32);
  m.mount("alpha", adapters_dir("qwen3-alpha"));
  m.mount("beta", adapters_dir("qwen3-beta"));
  const auto ab = m.resolve("alpha+beta");
  EXPECT_EQ(ab.spec, "alpha+beta");
  EXPECT_EQ(m.resolve(" alpha , beta ").slot, ab.slot);  // "a,b" is the same set
  const auto ba = m.resolve("beta+alpha");
  EXPECT_NE(ba.slot, ab.slot);  // summed in the order given: its own slot
  EXPECT_EQ(m.resolve("none").slot, -1);
  EXPECT_EQ(m.resolve("").slot, -1);  // no default yet
  try {
    m.resolve("alpha+gamma");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::NotFound);
    EXPECT_NE(std::string(e.what()).find("mounted: alpha, beta"), std::string::npos) << e.what();
  }
  EXPECT_THROW(m.resolve("alpha+alpha"), Error);
  EXPECT_THROW(m.resolve(std::string(5000, 'a')), Error);  // over the spec length limit
  m.set_default("beta");
  EXPECT_EQ(m.resolve("").spec, "beta");
  const auto pinned = m.resolve("alpha+beta");
  m.unmount("beta");
  EXPECT_EQ(m.default_spec(), "");
  EXPECT_EQ(m.snapshot()->slot(ab.slot), nullptr);
  // A request that pinned the old table still reads beta's factors.
  ASSERT_NE(pinned.table->slot(pinned.slot), nullptr);
  EXPECT_EQ(pinned.table->slot(pinned.slot)->adapters.size(), 2u);
  EXPECT_THROW(m.unmount("beta"), Error);
  EXPECT_THROW(m.resolve("beta"), Error);
}

// The residual op against a direct computation, and per-token slots against each slot run on its own.
TEST(LoraResidual, PerTokenSlotsMatchUniformRuns) {
  lora::AdapterManager m(qwen3_like_sites(), Device::CPU, DType::F32);
  m.mount("alpha", adapters_dir("qwen3-alpha"));
  m.mount("beta", adapters_dir("qwen3-beta"));
  const auto a = m.resolve("alpha"), ab = m.resolve("alpha+beta");
  const int site = m.sites().find("model.layers.1.self_attn.q_proj");
  const auto w = lora::read_adapter(adapters_dir("qwen3-alpha"));
  const lora::LoraFactor* f = nullptr;
  for (const auto& x : w.factors)
    if (x.module == "model.layers.1.self_attn.q_proj") f = &x;
  ASSERT_NE(f, nullptr);
  std::vector<float> xv(3 * 64);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = std::sin(0.37f * static_cast<float>(i));
  const Tensor x = Tensor::from_floats(xv, {3, 64});
  // Direct: y = scale * (x a^T) b^T.
  const std::vector<float> av = f->a.to_floats(), bv = f->b.to_floats();
  std::vector<float> want(3 * 64, 0.0f);
  for (int t = 0; t < 3; ++t)
    for (int o = 0; o < 64; ++o) {
      double acc = 0;
      for (int r = 0; r < 4; ++r) {
        double u = 0;
        for (int i = 0; i < 64; ++i) u += xv[t * 64 + i] * av[r * 64 + i];
        acc += u * bv[o * 4 + r];
      }
      want[t * 64 + o] = static_cast<float>(2.0 * acc);
    }
  auto run = [&](lora::ForwardContext ctx) {
    Tensor y = Tensor::zeros({3, 64}, DType::F32);
    const lora::ScopedContext s(&ctx);
    lora::add_residual(site, x, y);
    return y.to_floats();
  };
  const auto got = run(a.context());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5) << i;
  // Tokens 0 and 2 on alpha+beta, token 1 on the base.
  lora::ForwardContext mixed{m.snapshot(), -1, {ab.slot, -1, ab.slot}, {}};
  const auto mix = run(mixed), uni = run(ab.context());
  for (int o = 0; o < 64; ++o) {
    EXPECT_EQ(mix[o], uni[o]);
    EXPECT_EQ(mix[64 + o], 0.0f);
    EXPECT_EQ(mix[128 + o], uni[128 + o]);
  }
  EXPECT_NE(uni[128], got[128]);  // beta adds to layer 1's q_proj
  // No context: nothing added.
  Tensor y = Tensor::zeros({3, 64}, DType::F32);
  lora::add_residual(site, x, y);
  for (float v : y.to_floats()) EXPECT_EQ(v, 0.0f);
}

// The CPU default path's BF16 kernel (lora/cpu_residual.h) against the F32 route (--exact): close, and each
// row bit-identical whether it runs alone, in a mixed batch, on the calling thread or split over the pool.
TEST(LoraResidual, CpuBf16KernelMatchesF32AndRowsAreIndependent) {
  lora::AdapterManager f32(qwen3_like_sites(), Device::CPU, DType::F32),
      bf16(qwen3_like_sites(), Device::CPU, DType::F32, /*cpu_bf16=*/true);
  for (auto* m : {&f32, &bf16}) {
    m->mount("alpha", adapters_dir("qwen3-alpha"));
    m->mount("beta", adapters_dir("qwen3-beta"));
  }
  EXPECT_LT(bf16.list()[0].device_bytes, f32.list()[0].device_bytes);
  const int a = bf16.resolve("alpha").slot, ab = bf16.resolve("alpha+beta").slot;
  ASSERT_EQ(f32.resolve("alpha").slot, a);
  ASSERT_EQ(f32.resolve("alpha+beta").slot, ab);
  std::vector<float> xv(5 * 64);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = std::sin(0.11f * static_cast<float>(i * i % 97));
  const Tensor x = Tensor::from_floats(xv, {5, 64});
  for (const std::string module : {"model.layers.1.self_attn.q_proj", "model.layers.0.mlp.down_proj"}) {
    const int site = bf16.sites().find(module);
    const int64_t out = bf16.sites().at(site).out, in = bf16.sites().at(site).in;
    const Tensor xs =
        in == 64 ? x : Tensor::from_floats(std::vector<float>(static_cast<size_t>(5 * in), 0.25f), {5, in});
    auto run = [&](lora::AdapterManager& m, const Tensor& xr, std::vector<int32_t> slots) {
      lora::ForwardContext ctx{m.snapshot(), -1, std::move(slots), {}};
      Tensor y = Tensor::from_floats(std::vector<float>(static_cast<size_t>(xr.dim(0) * out), 0.5f), {xr.dim(0), out});
      const lora::ScopedContext s(&ctx);
      lora::add_residual(site, xr, y);
      return y.to_floats();
    };
    const std::vector<int32_t> mixed{ab, -1, a, ab, -1};
    const auto want = run(f32, xs, mixed), got = run(bf16, xs, mixed);
    float worst = 0, peak = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      worst = std::max(worst, std::abs(got[i] - want[i]));
      peak = std::max(peak, std::abs(want[i] - 0.5f));
    }
    EXPECT_GT(peak, 0.0f) << module;
    EXPECT_LE(worst, 1e-2f * std::max(1.0f, peak)) << module;
    // On the calling thread; one pool region (every thread computes u); two regions (dots, then columns).
    for (const auto& [inline_macs, redundant] :
         std::vector<std::pair<int64_t, int64_t>>{{int64_t{1} << 40, 0}, {0, int64_t{1} << 40}, {0, 0}}) {
      lora::set_cpu_residual_split(inline_macs, redundant);
      EXPECT_EQ(run(bf16, xs, mixed), got) << module << " split " << inline_macs << "/" << redundant;
      for (int64_t t = 0; t < 5; ++t) {
        const auto solo = run(bf16, xs.slice(0, t, t + 1).contiguous(), {mixed[static_cast<size_t>(t)]});
        EXPECT_EQ(solo, std::vector<float>(got.begin() + t * out, got.begin() + (t + 1) * out))
            << module << " row " << t;
      }
    }
    lora::set_cpu_residual_split(int64_t{1} << 14, int64_t{1} << 20);
  }
}

// The model's forward with adapters, solo and through forward(const Batch&) with rows on different slots.
TEST(LoraModel, BatchRowsWithDifferentAdaptersMatchSoloRuns) {
  auto model = load_model(test::model_dir("qwen3-q4g64"));
  lora::AdapterManager m(*model);
  EXPECT_EQ(m.sites().size(), 14);
  m.mount("alpha", adapters_dir("qwen3-alpha"));
  m.mount("beta", adapters_dir("qwen3-beta"));
  const std::vector<int32_t> p1{1, 87, 264, 84}, p2{201, 57, 325};
  auto solo = [&](const std::string& spec, const std::vector<int32_t>& ids) {
    const auto sel = m.resolve(spec);
    const auto ctx = sel.context();
    const lora::ScopedContext s(sel.slot >= 0 ? &ctx : nullptr);
    CacheList c = model->make_cache();
    return model->forward(ids, c, false).to_floats();
  };
  const auto base1 = solo("none", p1), a1 = solo("alpha", p1), ab2 = solo("alpha+beta", p2);
  EXPECT_NE(base1, a1);
  CacheList c1 = model->make_cache(), c2 = model->make_cache(), c3 = model->make_cache();
  Batch b;
  b.rows = {
      {p1, &c1, true, m.resolve("alpha").slot}, {p2, &c2, true, m.resolve("alpha+beta").slot}, {p1, &c3, true, -1}};
  const lora::ForwardContext engine{m.snapshot(), -1, {}, {}};
  const lora::ScopedContext s(&engine);
  const Tensor out = model->forward(b);
  const auto all = out.to_floats();
  const size_t V = static_cast<size_t>(out.dim(1));
  EXPECT_EQ(std::vector<float>(all.begin(), all.begin() + V), a1);
  EXPECT_EQ(std::vector<float>(all.begin() + V, all.begin() + 2 * V), ab2);
  EXPECT_EQ(std::vector<float>(all.begin() + 2 * V, all.end()), base1);
}

}  // namespace
}  // namespace lathe
