// Hostile or damaged model files (issue #12): nesting, FIFOs, huge ids, NaN weights and out-of-range config
// values are load errors that name the file (and the tensor or key), never a crash, a hang or a huge allocation.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "engine/chat_session.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "support/fixtures.h"
#include "tokenizer/tokenizer.h"

namespace lathe {
namespace {
namespace fs = std::filesystem;

class HardeningLoaders : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("lathe-harden-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    for (const char* f : {"config.json", "model.safetensors"})
      fs::copy_file(test::model_dir("qwen3-q4g64") + "/" + f, dir_ / f);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& f) const { return (dir_ / f).string(); }

  void edit_config(const std::function<void(nlohmann::json&)>& edit) {
    auto j = nlohmann::json::parse(read_text_file(path("config.json")));
    edit(j);
    std::ofstream(path("config.json")) << j.dump(1);
  }

  // The load error's message; fails the test when loading succeeds or throws something else.
  std::string load_error() {
    try {
      load_model(dir_.string());
    } catch (const Error& e) {
      return e.what();
    }
    ADD_FAILURE() << "loading " << dir_ << " did not fail";
    return {};
  }

  fs::path dir_;
};

#define EXPECT_CONTAINS(text, part)                                   \
  do {                                                                \
    const std::string _t = (text);                                    \
    EXPECT_NE(_t.find(part), std::string::npos) << "message: " << _t; \
  } while (0)

TEST_F(HardeningLoaders, DeeplyNestedConfigIsAnError) {
  // 200k levels crashed the loader (SIGSEGV).
  auto j = nlohmann::json::parse(read_text_file(path("config.json")));
  std::string text = j.dump();
  text.pop_back();
  text += ",\"extra\":" + std::string(200000, '[') + std::string(200000, ']') + "}";
  std::ofstream(path("config.json"), std::ios::trunc) << text;
  const std::string e = load_error();
  EXPECT_CONTAINS(e, "config.json");
  EXPECT_CONTAINS(e, "nested deeper than");
}

TEST_F(HardeningLoaders, ConfigValuesAreRangeChecked) {
  edit_config([](nlohmann::json& j) { j["max_position_embeddings"] = -5; });
  EXPECT_CONTAINS(load_error(), "max_position_embeddings");
  edit_config([](nlohmann::json& j) {
    j["max_position_embeddings"] = 128;
    j["rms_norm_eps"] = 0;
  });
  EXPECT_CONTAINS(load_error(), "rms_norm_eps");
  edit_config([](nlohmann::json& j) {
    j["rms_norm_eps"] = 1e-6;
    j["hidden_size"] = int64_t{1} << 40;
  });
  EXPECT_CONTAINS(load_error(), "hidden_size");
  edit_config([](nlohmann::json& j) {
    j["hidden_size"] = 64;
    if (j.contains("rope_parameters"))
      j["rope_parameters"]["rope_theta"] = -1;
    else
      j["rope_theta"] = -1;
  });
  EXPECT_CONTAINS(load_error(), "rope_theta");
}

// A fuzz finding: a top-level key of the wrong type escaped as a json type_error ("internal error").
TEST_F(HardeningLoaders, WronglyTypedTopLevelKeysAreCorruptErrors) {
  edit_config([](nlohmann::json& j) {
    j["text_config"] = j;
    j["model_type"] = 4;
    j["text_config"].erase("model_type");
  });
  EXPECT_CONTAINS(load_error(), "'model_type' has the wrong type");
  edit_config([](nlohmann::json& j) {
    j["model_type"] = j["text_config"].value("model_type", "qwen3");
    j["tie_word_embeddings"] = "yes";
    j["text_config"].erase("tie_word_embeddings");
  });
  EXPECT_CONTAINS(load_error(), "'tie_word_embeddings' has the wrong type");
}

TEST_F(HardeningLoaders, AFifoAsTheWeightsFileIsRefusedAtOnce) {
  fs::remove(path("model.safetensors"));
  ASSERT_EQ(::mkfifo(path("model.safetensors").c_str(), 0600), 0);
  // It hung (open waits for a writer); run it aside so a regression fails instead of hanging the suite.
  auto result = std::async(std::launch::async, [this] { return load_error(); });
  ASSERT_EQ(result.wait_for(std::chrono::seconds(10)), std::future_status::ready) << "loading a FIFO hangs";
  EXPECT_CONTAINS(result.get(), "not a regular file");
}

TEST_F(HardeningLoaders, NanWeightsAreNamed) {
  const std::string victim = "model.layers.1.input_layernorm.weight";
  {
    auto f = SafetensorsFile::open(path("model.safetensors"));
    std::map<std::string, Tensor> tensors;
    for (const auto& [name, info] : f->tensors()) tensors[name] = f->get(name).clone();
    f.reset();
    ASSERT_TRUE(tensors.count(victim));
    ASSERT_EQ(tensors[victim].dtype(), DType::BF16);
    tensors[victim].data<uint16_t>()[3] = 0x7FC0;  // a bf16 NaN
    SafetensorsWriter w;
    for (const auto& [name, t] : tensors) w.add(name, t);
    w.write(path("model.safetensors"));
  }
  const std::string e = load_error();
  EXPECT_CONTAINS(e, victim);
  EXPECT_CONTAINS(e, "NaN");
}

TEST_F(HardeningLoaders, SafetensorsShapeThatWrapsAroundIsCorrupt) {
  // 2^32 x 2^32 elements wrap to 0 in 64 bits: the size check alone would pass an empty data range.
  const std::string header = R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})";
  std::string bytes(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(bytes.data(), &n, 8);
  std::ofstream(path("x.safetensors"), std::ios::binary) << bytes << header;
  try {
    SafetensorsFile::open(path("x.safetensors"));
    ADD_FAILURE() << "opened";
  } catch (const Error& e) {
    EXPECT_CONTAINS(std::string(e.what()), "more elements");
  }
}

TEST(HardeningTokenizer, HugeVocabIdIsRefusedQuickly) {
  // An id of 200M took 6.4 GB and 27 s; 2^31-1 was "internal error: std::bad_alloc".
  for (const char* id : {"200000000", "2147483647"}) {
    const std::string tj = std::string(R"({"model":{"type":"BPE","vocab":{"a":0,"b":)") + id + R"(},"merges":[]}})";
    const auto t0 = std::chrono::steady_clock::now();
    try {
      Tokenizer::from_json(tj);
      ADD_FAILURE() << "accepted id " << id;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("token id"), std::string::npos) << e.what();
    }
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
  }
}

TEST(HardeningTokenizer, DeeplyNestedTokenizerJsonIsAnError) {
  const std::string tj = R"({"model":{"type":"BPE","vocab":{},"merges":[]},"x":)" + std::string(100000, '[') +
                         std::string(100000, ']') + "}";
  EXPECT_THROW(Tokenizer::from_json(tj), Error);
}

TEST(HardeningTemplate, ASyntaxErrorInTheModelsTemplateIsALoadError) {
  // It was swallowed as "no chat template", so serve started and every chat request failed.
  const fs::path dir = fs::temp_directory_path() / ("lathe-harden-tmpl-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(test::model_dir("qwen3-q4g64") + "/" + f, dir / f);
  std::ofstream(dir / "chat_template.jinja") << "{% for m in messages %}{{ m.content }";
  std::string what;
  try {
    ChatSession session(dir.string());
  } catch (const Error& e) {
    what = e.what();
  }
  EXPECT_CONTAINS(what, "syntax error");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace lathe
