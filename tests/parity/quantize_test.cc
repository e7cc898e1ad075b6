// `quantize` against the fixtures: our quantization of each bf16 fixture gives the bytes of the fixture's own
// q4g64 / q8g32 reference (same MLX rounding), the output loads and reproduces the reference logits;
// 3, 5 and 6-bit outputs round-trip through the loader; recipes report bits-per-weight and KL; bad input
// fails with a clear error and never leaves anything under the output name.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>

#include "common/error.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "lab/quantize/quantizer.h"
#include "model/model.h"
#include "quant/affine.h"
#include "support/fixtures.h"

namespace lathe::lab {
namespace {

namespace fs = std::filesystem;
using jobs::json;

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag) {
    path = fs::temp_directory_path() / ("lathe_quantize_" + tag + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

const jobs::Emit kQuiet = [](const json&) {};

QuantizeOptions opts(const std::string& src, const fs::path& out, int bits, int group) {
  QuantizeOptions o;
  o.source = test::model_dir(src);
  o.output = out.string();
  o.bits = bits;
  o.group_size = group;
  o.eval_tokens = 0;
  return o;
}

// Fraction of bytes that differ, and whether every differing weight code is off by at most one step.
struct Diff {
  size_t tensors = 0, differing_bytes = 0, total_bytes = 0;
};

Diff compare_checkpoints(const std::string& got_dir, const std::string& ref_dir) {
  const Checkpoint got = Checkpoint::open(got_dir), ref = Checkpoint::open(ref_dir);
  EXPECT_EQ(got.names(), ref.names());
  Diff d;
  for (const auto& name : ref.names()) {
    if (!got.has(name)) continue;
    const Tensor a = got.get(name), b = ref.get(name);
    EXPECT_EQ(a.dtype(), b.dtype()) << name;
    EXPECT_EQ(a.shape(), b.shape()) << name;
    if (a.shape() != b.shape() || a.dtype() != b.dtype()) continue;
    const size_t n = static_cast<size_t>(a.numel()) * dtype_size(a.dtype());
    const auto* pa = static_cast<const unsigned char*>(a.raw());
    const auto* pb = static_cast<const unsigned char*>(b.raw());
    for (size_t i = 0; i < n; ++i) d.differing_bytes += pa[i] != pb[i];
    d.total_bytes += n;
    ++d.tensors;
  }
  return d;
}

class QuantizeFixture : public ::testing::TestWithParam<std::tuple<const char*, const char*>> {};

TEST_P(QuantizeFixture, MatchesTheReferenceBytesAndLogits) {
  const std::string arch = std::get<0>(GetParam()), variant = std::get<1>(GetParam());
  const std::string ref = arch + "-" + variant;
  const int bits = variant == "q4g64" ? 4 : 8, group = variant == "q4g64" ? 64 : 32;
  TempDir d(ref);
  const fs::path out = d.path / "out";
  const jobs::JobResult r = quantize_checkpoint(opts(arch + "-bf16", out, bits, group), kQuiet);
  ASSERT_EQ(*r.output_path, fs::absolute(out).lexically_normal().string());
  const Diff diff = compare_checkpoints(out.string(), test::model_dir(ref));
  EXPECT_GT(diff.tensors, 0u);
  EXPECT_EQ(diff.differing_bytes, 0u) << ref << ": " << diff.differing_bytes << " of " << diff.total_bytes
                                      << " bytes differ";
  const json cfg = json::parse(read_text_file(out.string() + "/config.json"));
  EXPECT_EQ(cfg["quantization"]["bits"], bits);
  EXPECT_EQ(cfg["quantization"]["group_size"], group);
  EXPECT_TRUE(fs::exists(out / "tokenizer.json"));
  EXPECT_TRUE(fs::exists(out / "generation_config.json"));
  EXPECT_TRUE(fs::exists(out / "model.safetensors.index.json"));
  const double bpw = r.summary["bits_per_weight"];
  EXPECT_NEAR(bpw, bits + 32.0 / group, 1e-9);

  // The output runs and gives the reference's logits (the reference ran on the dequantized weights).
  const auto reference = test::load_reference(ref);
  LoadOptions exact;
  exact.exact = true;  // the f32 kernels, as the parity suites use
  auto model = load_model(out.string(), exact);
  auto caches = model->make_cache();
  const Tensor logits = model->forward(reference.prompts.at("chat"), caches, true);
  const Tensor want = reference.logits->get("logits_chat");
  const std::vector<float> g(logits.data<float>(), logits.data<float>() + logits.numel());
  const std::vector<float> w(want.data<float>(), want.data<float>() + want.numel());
  const auto a = test::compare_logits(g, w, want.dim(1));
  EXPECT_TRUE(a.within()) << ref << ": max|Δ| " << a.max_abs_diff << " of " << a.max_abs_ref;
  EXPECT_EQ(a.argmax_mismatches, 0);
}

// Every bf16 fixture with a quantized sibling made by MLX from it.
INSTANTIATE_TEST_SUITE_P(Fixtures, QuantizeFixture,
                         ::testing::Values(std::tuple{"qwen3", "q4g64"}, std::tuple{"qwen3", "q8g32"},
                                           std::tuple{"llama", "q4g64"}, std::tuple{"llama", "q8g32"},
                                           std::tuple{"gemma3", "q4g64"}, std::tuple{"gemma3", "q8g32"},
                                           std::tuple{"gemma4", "q4g64"}, std::tuple{"gemma4moe", "q4g64"},
                                           std::tuple{"qwen3_5", "q4g64"}));

TEST(Quantize, ThreeFiveAndSixBitsRoundTripThroughTheLoader) {
  const Checkpoint src = Checkpoint::open(test::model_dir("qwen3-bf16"));
  for (int bits : {3, 5, 6}) {
    TempDir d("odd" + std::to_string(bits));
    const fs::path out = d.path / "out";
    const auto r = quantize_checkpoint(opts("qwen3-bf16", out, bits, 32), kQuiet);
    EXPECT_NEAR(r.summary["bits_per_weight"].get<double>(), bits + 1.0, 1e-9);
    // Every code decodes to within half a step of the source weight.
    const Checkpoint q = Checkpoint::open(out.string());
    const std::string m = "model.layers.1.mlp.down_proj";
    const Tensor w = q.get(m + ".weight"), s = q.get(m + ".scales").to(DType::F32),
                 b = q.get(m + ".biases").to(DType::F32), ref = src.get(m + ".weight").to(DType::F32);
    const int64_t rows = ref.dim(0), cols = ref.dim(1);
    ASSERT_EQ(w.dim(1), cols * bits / 32);
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r0 = 0; r0 < rows; ++r0) {
      quant::dequantize_row(w.data<uint32_t>() + r0 * w.dim(1), cols, bits, 32, s.data<float>() + r0 * (cols / 32),
                            b.data<float>() + r0 * (cols / 32), row.data());
      for (int64_t c = 0; c < cols; ++c) {
        const float step = std::fabs(s.data<float>()[r0 * (cols / 32) + c / 32]);
        // MLX rounding: half a step inside the range; up to one step at the far extreme, where rounding
        // edge/scale to a whole code shrinks the covered range.
        ASSERT_LE(std::fabs(row[static_cast<size_t>(c)] - ref.data<float>()[r0 * cols + c]), 1.02f * step + 1e-6f)
            << bits << "-bit " << r0 << "," << c;
      }
    }
    // The loader takes it and the model's next-token choice mostly follows the bf16 source.
    auto model = load_model(out.string());
    auto caches = model->make_cache();
    const auto reference = test::load_reference("qwen3-bf16");
    const Tensor logits = model->forward(reference.prompts.at("chat"), caches, true);
    EXPECT_EQ(logits.dim(0), static_cast<int64_t>(reference.prompts.at("chat").size()));
  }
}

TEST(Quantize, MixedRecipeReportsBitsPerWeightAndKl) {
  TempDir d("mixed");
  QuantizeOptions o = opts("qwen3-bf16", d.path / "out", 4, 64);
  o.recipe = "mixed_3_6";
  o.eval_tokens = 24;
  std::vector<std::string> stages;
  const auto r = quantize_checkpoint(o, [&](const json& e) { stages.push_back(e.value("stage", "")); });
  const json& s = r.summary;
  EXPECT_GT(s["modules_by_bits"]["3"].get<int>(), 0);
  EXPECT_GT(s["modules_by_bits"]["6"].get<int>(), 0);
  const double bpw = s["bits_per_weight"];
  EXPECT_GT(bpw, 3.5);
  EXPECT_LT(bpw, 6.5);
  ASSERT_TRUE(s["kl"].contains("mean_kl")) << s["kl"].dump();
  EXPECT_GT(s["kl"]["mean_kl"].get<double>(), 0.0);
  EXPECT_LT(s["kl"]["mean_kl"].get<double>(), 5.0);  // the fixture's random weights: far from zero even at 6 bits
  EXPECT_GT(s["kl"]["positions"].get<int>(), 10);
  const json cfg = json::parse(read_text_file((d.path / "out/config.json").string()));
  EXPECT_EQ(cfg["quantization"]["bits"], 3);
  // Two layers: layer 1 is the last eighth, so its v_proj and down_proj get the high bits; layer 0 the low.
  EXPECT_EQ(cfg["quantization"]["model.layers.1.mlp.down_proj"]["bits"], 6);
  EXPECT_EQ(cfg["quantization"]["model.layers.1.self_attn.v_proj"]["bits"], 6);
  EXPECT_FALSE(cfg["quantization"].contains("model.layers.0.mlp.down_proj"));
  EXPECT_EQ(stages.front(), "starting");
  EXPECT_EQ(stages.back(), "done");
  EXPECT_NE(std::find(stages.begin(), stages.end(), "quantizing"), stages.end());
}

TEST(Quantize, ShardedOutputHasTheSameBytesAndIsNotRequantized) {
  TempDir d("shards");
  QuantizeOptions o = opts("qwen3-bf16", d.path / "out", 4, 64);
  o.shard_bytes = 40000;
  const auto r = quantize_checkpoint(o, kQuiet);
  EXPECT_GT(r.summary["shards"].get<int>(), 1);
  EXPECT_TRUE(fs::exists(
      d.path / ("out/model-00001-of-0000" + std::to_string(r.summary["shards"].get<int>()) + ".safetensors")));
  const Diff diff = compare_checkpoints((d.path / "out").string(), test::model_dir("qwen3-q4g64"));
  EXPECT_EQ(diff.differing_bytes, 0u);
  // Re-quantizing the sharded output is refused: it is already quantized.
  QuantizeOptions again = opts("qwen3-bf16", d.path / "again", 4, 64);
  again.source = (d.path / "out").string();
  EXPECT_THROW(quantize_checkpoint(again, kQuiet), Error);
}

// A VLM wrapper (mlx-community layout): the text weights under `language_model.`, plus a vision tensor. The
// text weights quantize to the same bytes as the plain model's; the vision tensor passes through unchanged.
TEST(Quantize, VlmWrapperKeepsItsNamesAndSkipsTheVisionTower) {
  TempDir d("vlm");
  const fs::path src = d.path / "src";
  fs::create_directories(src);
  const auto plain = SafetensorsFile::open(test::model_dir("gemma3-bf16") + "/model.safetensors");
  SafetensorsWriter w;
  for (const auto& [name, info] : plain->tensors()) w.add("language_model." + name, plain->get(name));
  const Tensor vision = Tensor::zeros({64, 64}, DType::BF16);
  w.add("vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight", vision);
  w.write((src / "model.safetensors").string());
  json cfg = json::parse(read_text_file(test::model_dir("gemma3-bf16") + "/config.json"));
  const std::string text = cfg.dump();
  write_file_atomic((src / "config.json").string(), text.data(), text.size());
  fs::copy_file(test::model_dir("gemma3-bf16") + "/tokenizer.json", src / "tokenizer.json");
  QuantizeOptions o = opts("gemma3-bf16", d.path / "out", 4, 64);
  o.source = src.string();
  quantize_checkpoint(o, kQuiet);
  const auto out = SafetensorsFile::open((d.path / "out/model.safetensors").string());
  EXPECT_TRUE(out->has("vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight"));
  EXPECT_FALSE(out->has("vision_tower.vision_model.encoder.layers.0.mlp.fc1.scales"));
  EXPECT_EQ(out->tensors().at("vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight").dtype, DType::BF16);
  const auto ref = SafetensorsFile::open(test::model_dir("gemma3-q4g64") + "/model.safetensors");
  size_t compared = 0;
  for (const auto& [name, info] : ref->tensors()) {
    ASSERT_TRUE(out->has("language_model." + name)) << name;
    const Tensor a = out->get("language_model." + name), b = ref->get(name);
    ASSERT_EQ(a.shape(), b.shape()) << name;
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), static_cast<size_t>(b.numel()) * dtype_size(b.dtype())), 0) << name;
    ++compared;
  }
  EXPECT_GT(compared, 10u);
  auto model = load_model((d.path / "out").string());  // the loader reads the wrapper's names
  EXPECT_NE(model, nullptr);
}

void expect_error(const QuantizeOptions& o, ErrorKind kind, const std::string& words) {
  try {
    quantize_checkpoint(o, kQuiet);
    FAIL() << "expected an error mentioning '" << words << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

TEST(Quantize, BadInputIsAClearErrorAndLeavesNothing) {
  TempDir d("bad");
  QuantizeOptions o = opts("qwen3-bf16", d.path / "out", 4, 64);
  o.source = "/nonexistent/model";
  expect_error(o, ErrorKind::NotFound, "/nonexistent/model");
  o = opts("qwen3-bf16", d.path / "out", 7, 64);
  expect_error(o, ErrorKind::InvalidArgument, "bits must be");
  o = opts("qwen3-bf16", d.path / "out", 4, 48);
  expect_error(o, ErrorKind::InvalidArgument, "group_size");
  o = opts("qwen3-bf16", d.path / "out", 4, 64);
  o.recipe = "best";
  expect_error(o, ErrorKind::InvalidArgument, "unknown recipe");
  o = opts("qwen3-q4g64", d.path / "out", 4, 64);
  expect_error(o, ErrorKind::Unsupported, "already quantized");
  o = opts("qwen3-bf16", "/proc/lathe-out", 4, 64);
  expect_error(o, ErrorKind::Io, "/proc/lathe-out");
  fs::create_directories(d.path / "exists");
  o = opts("qwen3-bf16", d.path / "exists", 4, 64);
  expect_error(o, ErrorKind::InvalidArgument, "already exists");
  EXPECT_FALSE(fs::exists(d.path / "out"));
}

// Disk full mid-write, injected with RLIMIT_FSIZE on a real `lathe quantize`: the write fails (EFBIG), the
// run exits non-zero naming the write, and neither the output nor its temporary folder is left behind.
TEST(Quantize, DiskFullMidWriteLeavesNoPartialOutput) {
  TempDir d("full");
  const std::string out = (d.path / "out").string();
  const std::string err = (d.path / "stderr.txt").string();
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    rlimit lim{100000, 100000};  // the source is 233 KB: the first shard cannot be written
    ::setrlimit(RLIMIT_FSIZE, &lim);
    if (!std::freopen(err.c_str(), "w", stderr)) ::_exit(120);
    const std::string model = test::model_dir("qwen3-bf16");
    ::execl(LATHE_BINARY, LATHE_BINARY, "quantize", "--model", model.c_str(), "--out", out.c_str(), "--bits", "8",
            "--group-size", "32", "--eval-tokens", "0", static_cast<char*>(nullptr));
    ::_exit(121);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_NE(WEXITSTATUS(status), 0);
  const std::string text = read_text_file(err);
  EXPECT_NE(text.find("write failed"), std::string::npos) << text;
  EXPECT_FALSE(fs::exists(out));
  for (const auto& e : fs::directory_iterator(d.path))
    EXPECT_EQ(e.path().filename().string().find("out"), std::string::npos) << e.path();
}

}  // namespace
}  // namespace lathe::lab
