// lathe fuse (lab/fuse/fuser.h): a LoRA adapter folded into its base. Dequantized, the fused model gives the
// reference logits of base + adapter (up to the bf16 weights mlx-lm's fuse writes); re-quantized, the fused
// modules hold the fused weights to within half a quantization step and every other tensor is the base's,
// byte for byte; an adapter for another base is refused before anything is written.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <set>

#include "common/error.h"
#include "common/fixture_reference.h"
#include "lab/fuse/fuser.h"
#include "model/model.h"
#include "quant/affine.h"
#include "support/fixtures.h"

namespace lathe {
namespace {

namespace fs = std::filesystem;

std::string adapter_dir(const std::string& name) { return test::fixtures_dir() + "/adapters/" + name; }

struct TempRoot {
  fs::path path = fs::temp_directory_path() / ("lathe_fuse_test_" + std::to_string(::getpid()));
  TempRoot() { fs::create_directories(path); }
  ~TempRoot() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

jobs::JobResult fuse(const std::string& base, const std::string& adapter, const std::string& out, bool dequantize) {
  lab::FuseOptions o;
  o.model = test::model_dir(base);
  o.adapter = adapter_dir(adapter);
  o.output = out;
  o.dequantize = dequantize;
  return lab::fuse_adapter(o, [](const jobs::json&) {});
}

std::vector<float> as_f32(const Tensor& t) { return t.to_floats(); }

TEST(FuseParity, DequantizedFuseGivesTheAdapterLogits) {
  TempRoot tmp;
  const auto ref = nlohmann::json::parse(read_text_file(adapter_dir("qwen3-reference") + "/reference.json"));
  const auto refs = SafetensorsFile::open(adapter_dir("qwen3-reference") + "/reference.safetensors");
  const std::string out = (tmp.path / "fused").string();
  const jobs::JobResult r = fuse(ref["base"].get<std::string>(), "qwen3-alpha", out, true);
  EXPECT_EQ(r.summary["fused_modules"], 6);
  EXPECT_GT(r.summary["dequantized_modules"].get<int>(), 6);  // the whole model, not only the fused modules
  const auto config = nlohmann::json::parse(read_text_file(out + "/config.json"));
  EXPECT_FALSE(config.contains("quantization"));
  EXPECT_FALSE(config.contains("quantization_config"));

  LoadOptions exact;
  exact.exact = true;
  auto model = load_model(out, exact);
  CacheList c = model->make_cache();
  const auto prompt = ref["prompt"].get<std::vector<int32_t>>();
  const testing::Diff d = testing::compare_logits(model->forward(prompt, c, true), refs->get("logits_chat_alpha"));
  // The fused weights are bf16, as mlx-lm writes them (measured 1.4% of the logits' scale on these factors,
  // which are large; the runtime adapter path over the same base stays within 1e-3).
  EXPECT_EQ(d.argmax_agree, d.rows);
  EXPECT_LE(d.max_abs, 2e-2 * std::max(1.0, d.max_ref)) << "max |diff| " << d.max_abs << " of " << d.max_ref;
  EXPECT_GT(d.max_abs, 0.0);  // the adapter changed the model: the same check on the bare base must fail
  auto base = load_model(test::model_dir(ref["base"].get<std::string>()), exact);
  CacheList cb = base->make_cache();
  const testing::Diff bare = testing::compare_logits(base->forward(prompt, cb, true), refs->get("logits_chat_alpha"));
  EXPECT_GT(bare.max_abs, 2e-2 * std::max(1.0, bare.max_ref));
}

TEST(FuseParity, RequantizedFuseKeepsOtherTensorsAndBoundsTheError) {
  TempRoot tmp;
  const std::string q4 = (tmp.path / "q4").string(), dense = (tmp.path / "dense").string();
  const jobs::JobResult r = fuse("qwen3-q4g64", "qwen3-alpha", q4, false);
  EXPECT_EQ(r.summary["requantized_modules"], 6);
  fuse("qwen3-q4g64", "qwen3-alpha", dense, true);
  const auto base = SafetensorsFile::open(test::model_dir("qwen3-q4g64") + "/model.safetensors");
  const auto got = SafetensorsFile::open(q4 + "/model.safetensors");
  const auto want = SafetensorsFile::open(dense + "/model.safetensors");
  const std::set<std::string> fused = {"model.layers.0.mlp.down_proj",    "model.layers.0.self_attn.q_proj",
                                       "model.layers.0.self_attn.v_proj", "model.layers.1.mlp.down_proj",
                                       "model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.v_proj"};
  ASSERT_EQ(got->tensors().size(), base->tensors().size());
  int checked = 0;
  for (const auto& [name, info] : base->tensors()) {
    const Tensor b = base->get(name), g = got->get(name);
    ASSERT_EQ(g.shape(), b.shape()) << name;
    ASSERT_EQ(g.dtype(), b.dtype()) << name;
    const std::string module = name.substr(0, name.rfind('.'));
    const bool same = std::memcmp(g.raw(), b.raw(), info.end - info.begin) == 0;
    if (!fused.count(module)) {
      EXPECT_TRUE(same) << name << " is not fused and must be copied as stored";
      continue;
    }
    EXPECT_FALSE(same) << name << " was fused";
    if (!name.ends_with(".weight")) continue;
    // Dequantize the re-quantized rows and hold them to the fused bf16 weights: within a step of the row's group
    // (MLX's affine scheme keeps the group's larger-magnitude extreme exact, so the far end may miss by more than
    // half a step), and half a step on average.
    const Tensor s = got->get(module + ".scales"), bi = got->get(module + ".biases"), w = want->get(name);
    const int64_t rows = w.dim(0), cols = w.dim(1), groups = s.dim(1), gs = cols / groups;
    const std::vector<float> sf = as_f32(s), bf = as_f32(bi), wf = as_f32(w);
    std::vector<float> row(static_cast<size_t>(cols));
    double err_in_steps = 0;
    for (int64_t i = 0; i < rows; ++i) {
      quant::dequantize_row(static_cast<const uint32_t*>(g.raw()) + i * cols * 4 / 32, cols, 4, static_cast<int>(gs),
                            sf.data() + i * groups, bf.data() + i * groups, row.data());
      for (int64_t j = 0; j < cols; ++j) {
        const float step = std::fabs(sf[static_cast<size_t>(i * groups + j / gs)]);
        const float target = wf[static_cast<size_t>(i * cols + j)];
        const float err = std::fabs(row[static_cast<size_t>(j)] - target);
        ASSERT_LE(err, step + 1e-2f * std::fabs(target) + 1e-6f) << name << " [" << i << ", " << j << "]";
        err_in_steps += err / std::max(step, 1e-12f);
      }
    }
    EXPECT_LE(err_in_steps / static_cast<double>(rows * cols), 0.5) << name;
    ++checked;
  }
  EXPECT_EQ(checked, 6);
  // The re-quantized checkpoint loads and runs.
  auto model = load_model(q4, LoadOptions{});
  CacheList c = model->make_cache();
  const std::vector<float> logits = model->forward({1, 2, 3}, c, true).to_floats();
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));
}

TEST(FuseParity, AnAdapterForAnotherBaseIsRefusedAndNothingIsWritten) {
  TempRoot tmp;
  const std::string out = (tmp.path / "fused").string();
  try {
    fuse("qwen3_5-bf16", "qwen3-alpha", out, false);
    FAIL() << "fusing a qwen3 adapter into qwen3_5 was taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("another base model"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_empty(tmp.path)) << "no output and no temporary folder may be left";
  // An existing output is refused before any work.
  fs::create_directories(out);
  EXPECT_THROW(fuse("qwen3-q4g64", "qwen3-alpha", out, false), Error);
  // Through the CLI: a clear message and a failing exit status.
  const std::string cmd = std::string(LATHE_BINARY) + " fuse --model " + test::model_dir("qwen3_5-bf16") +
                          " --adapter " + adapter_dir("qwen3-alpha") + " --out " + (tmp.path / "cli").string() +
                          " > /dev/null 2>&1";
  EXPECT_NE(std::system(cmd.c_str()), 0);
  EXPECT_FALSE(fs::exists(tmp.path / "cli"));
}

TEST(FuseParity, JobConfigIsChecked) {
  EXPECT_THROW(lab::parse_fuse_options({{"model", "m"}, {"out", "o"}}), Error);  // no adapter
  EXPECT_THROW(lab::parse_fuse_options({{"model", "m"}, {"adapter", "a"}, {"out", "o"}, {"dequantize", "yes"}}), Error);
  EXPECT_THROW(lab::parse_fuse_options({{"model", "m"}, {"adapter", "a"}, {"out", "o"}, {"bits", 4}}), Error);
  const lab::FuseOptions o =
      lab::parse_fuse_options({{"model", "m"}, {"adapter", "a"}, {"out", "o"}, {"dequantize", true}});
  EXPECT_TRUE(o.dequantize);
}

}  // namespace
}  // namespace lathe
