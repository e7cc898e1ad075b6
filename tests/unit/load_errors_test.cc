// Bad checkpoints get a clear error naming the file and the tensor, never a crash.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "support/fixtures.h"

namespace lathe {
namespace {
namespace fs = std::filesystem;

// A scratch copy of a fixture model that a test can damage.
class BrokenCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("lathe-bad-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    for (const char* f : {"config.json", "model.safetensors"})
      fs::copy_file(test::model_dir("qwen3-q4g64") + "/" + f, dir_ / f);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& f) const { return (dir_ / f).string(); }

  // Rewrites model.safetensors through `edit`, which may drop, replace or add tensors.
  void rewrite(const std::function<void(std::map<std::string, Tensor>&)>& edit) {
    auto f = SafetensorsFile::open(path("model.safetensors"));
    std::map<std::string, Tensor> tensors;
    for (const auto& [name, info] : f->tensors()) tensors[name] = f->get(name).clone();
    f.reset();
    edit(tensors);
    SafetensorsWriter w;
    for (const auto& [name, t] : tensors) w.add(name, t);
    w.write(path("model.safetensors"));
  }

  void edit_config(const std::function<void(nlohmann::json&)>& edit) {
    auto j = nlohmann::json::parse(read_text_file(path("config.json")));
    edit(j);
    std::ofstream(path("config.json")) << j.dump(1);
  }

  // Loads and returns the error; fails the test if loading succeeds or throws something else.
  Error load_error() {
    try {
      load_model(dir_.string());
    } catch (const Error& e) {
      return e;
    }
    ADD_FAILURE() << "loading " << dir_ << " did not fail";
    return Error(ErrorKind::Internal, "");
  }

  void write_raw(const std::string& bytes) {
    std::ofstream(path("model.safetensors"), std::ios::binary | std::ios::trunc) << bytes;
  }

  static std::string header_file(const std::string& header_json, size_t data_bytes) {
    std::string s(8, '\0');
    const uint64_t n = header_json.size();
    std::memcpy(s.data(), &n, 8);
    return s + header_json + std::string(data_bytes, '\0');
  }

  fs::path dir_;
};

#define EXPECT_MENTIONS(err, text) \
  EXPECT_NE(std::string((err).what()).find(text), std::string::npos) << "message: " << (err).what()

TEST_F(BrokenCheckpoint, TruncatedFileNamesFileAndTensor) {
  const auto size = fs::file_size(path("model.safetensors"));
  fs::resize_file(path("model.safetensors"), size - 100);
  const Error e = load_error();
  EXPECT_EQ(e.kind(), ErrorKind::Corrupt);
  EXPECT_MENTIONS(e, "model.safetensors");
  EXPECT_MENTIONS(e, "truncated");
  EXPECT_MENTIONS(e, "tensor '");
}

TEST_F(BrokenCheckpoint, TinyFileIsReportedAsTruncated) {
  write_raw("abc");
  const Error e = load_error();
  EXPECT_EQ(e.kind(), ErrorKind::Corrupt);
  EXPECT_MENTIONS(e, "truncated");
}

TEST_F(BrokenCheckpoint, HeaderLengthPastEndOfFile) {
  write_raw(header_file("{}", 0).substr(0, 8) + "{}");
  std::string bytes(8, '\0');
  const uint64_t n = 1000;
  std::memcpy(bytes.data(), &n, 8);
  write_raw(bytes + "{}");
  const Error e = load_error();
  EXPECT_MENTIONS(e, "header length 1000");
}

TEST_F(BrokenCheckpoint, HeaderThatIsNotJson) {
  write_raw(header_file("{not json", 0));
  const Error e = load_error();
  EXPECT_EQ(e.kind(), ErrorKind::Corrupt);
  EXPECT_MENTIONS(e, "not valid JSON");
}

TEST_F(BrokenCheckpoint, OffsetsOutOfRange) {
  write_raw(header_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8));
  const Error e = load_error();
  EXPECT_MENTIONS(e, "tensor 'a'");
  EXPECT_MENTIONS(e, "past the end");
}

TEST_F(BrokenCheckpoint, OverlappingTensors) {
  write_raw(header_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                        R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
                        24));
  const Error e = load_error();
  EXPECT_MENTIONS(e, "'a' and 'b' overlap");
}

TEST_F(BrokenCheckpoint, ByteCountDisagreesWithShape) {
  write_raw(header_file(R"({"a":{"dtype":"BF16","shape":[4],"data_offsets":[0,16]}})", 16));
  const Error e = load_error();
  EXPECT_MENTIONS(e, "tensor 'a' holds 16 bytes but BF16[4] needs 8");
}

TEST_F(BrokenCheckpoint, UnknownDtype) {
  write_raw(header_file(R"({"a":{"dtype":"F8_E9M9","shape":[4],"data_offsets":[0,4]}})", 4));
  const Error e = load_error();
  EXPECT_EQ(e.kind(), ErrorKind::Unsupported);
  EXPECT_MENTIONS(e, "F8_E9M9");
}

TEST_F(BrokenCheckpoint, ShapeMismatchAgainstConfig) {
  rewrite([](auto& t) { t["model.norm.weight"] = Tensor::zeros({32}, DType::BF16); });
  const Error e = load_error();
  EXPECT_EQ(e.kind(), ErrorKind::Corrupt);
  EXPECT_MENTIONS(e, "model.safetensors: tensor 'model.norm.weight' has shape [32]");
}

TEST_F(BrokenCheckpoint, QuantizedWeightWithWrongDtype) {
  rewrite([](auto& t) {
    t["model.layers.0.mlp.up_proj.weight"] = Tensor::zeros(t["model.layers.0.mlp.up_proj.weight"].shape(), DType::F32);
  });
  const Error e = load_error();
  EXPECT_MENTIONS(e, "tensor 'model.layers.0.mlp.up_proj.weight' has dtype F32");
}

TEST_F(BrokenCheckpoint, MissingTensor) {
  rewrite([](auto& t) { t.erase("model.layers.1.self_attn.k_proj.weight"); });
  const Error e = load_error();
  EXPECT_EQ(e.kind(), ErrorKind::NotFound);
  EXPECT_MENTIONS(e, "model.layers.1.self_attn.k_proj.weight");
}

TEST_F(BrokenCheckpoint, UnknownModelType) {
  edit_config([](auto& j) { j["model_type"] = "transmogrifier"; });
  const Error e = load_error();
  EXPECT_EQ(e.kind(), ErrorKind::Unsupported);
  EXPECT_MENTIONS(e, "unknown model_type 'transmogrifier'");
  EXPECT_MENTIONS(e, "config.json");
}

TEST_F(BrokenCheckpoint, UnsupportedBits) {
  edit_config([](auto& j) { j["quantization"]["bits"] = 7; });  // 3, 5 and 6 load (dequantized at load)
  const Error e = load_error();
  EXPECT_EQ(e.kind(), ErrorKind::Unsupported);
  EXPECT_MENTIONS(e, "7-bit");
}

TEST_F(BrokenCheckpoint, BitsThatDisagreeWithPackedShape) {
  edit_config([](auto& j) { j["quantization"]["bits"] = 8; });
  const Error e = load_error();
  EXPECT_EQ(e.kind(), ErrorKind::Corrupt);
  EXPECT_MENTIONS(e, "8-bit");
  EXPECT_MENTIONS(e, "model.safetensors: tensor 'model.");
}

TEST_F(BrokenCheckpoint, ConfigThatIsNotJson) {
  std::ofstream(path("config.json")) << "{\"model_type\": ";
  const Error e = load_error();
  EXPECT_MENTIONS(e, "config.json: not valid JSON");
}

TEST_F(BrokenCheckpoint, ConfigMissingRequiredKey) {
  edit_config([](auto& j) { j.erase("hidden_size"); });
  const Error e = load_error();
  EXPECT_MENTIONS(e, "hidden_size");
}

TEST_F(BrokenCheckpoint, MissingDirectory) {
  fs::remove_all(dir_);
  const Error e = load_error();
  EXPECT_EQ(e.kind(), ErrorKind::NotFound);
}

TEST_F(BrokenCheckpoint, ShardIndexNamingAMissingTensor) {
  std::ofstream(path("model.safetensors.index.json"))
      << R"({"weight_map": {"model.norm.weight": "model.safetensors", "ghost.weight": "model.safetensors"}})";
  const Error e = load_error();
  EXPECT_MENTIONS(e, "'ghost.weight'");
}

}  // namespace
}  // namespace lathe
