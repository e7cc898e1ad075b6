// The tokenizer cache: a large tokenizer.json loads the same from its binary image as from the JSON, and a
// stale or damaged image is ignored and rewritten, never trusted.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>

#include "tokenizer_fixtures.h"

namespace lathe {
namespace {

namespace fs = std::filesystem;

class TokenizerCache : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("lathe-tokcache-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "model");
    const auto src = test::tokenizer_fixture_dir("qwen3-real");
    std::ofstream(root_ / "model/tokenizer.json", std::ios::binary) << test::read_maybe_gzipped(src / "tokenizer.json");
    std::ofstream(root_ / "model/tokenizer_config.json", std::ios::binary)
        << test::read_maybe_gzipped(src / "tokenizer_config.json");
    ::setenv("LATHE_CACHE_DIR", (root_ / "cache").c_str(), 1);
  }
  void TearDown() override {
    ::unsetenv("LATHE_CACHE_DIR");
    fs::remove_all(root_);
  }
  std::vector<fs::path> images() const {
    std::vector<fs::path> out;
    if (fs::exists(root_ / "cache/tokenizers"))
      for (const auto& e : fs::directory_iterator(root_ / "cache/tokenizers")) out.push_back(e.path());
    return out;
  }
  // Every oracle text encodes and decodes the same as the tokenizer parsed straight from JSON.
  void expect_same_as_reference(const Tokenizer& t) {
    const Tokenizer& ref = test::fixture_tokenizer("qwen3-real");
    for (const auto& c : test::encode_oracle("qwen3")) {
      const std::string text = c["text"];
      const auto ids = t.encode(text, true);
      EXPECT_EQ(ids, ref.encode(text, true)) << text;
      EXPECT_EQ(t.decode(ids), ref.decode(ids)) << text;
    }
    EXPECT_EQ(t.vocab_size(), ref.vocab_size());
  }
  fs::path root_;
};

TEST_F(TokenizerCache, SecondLoadComesFromTheImageAndMatches) {
  const auto first = Tokenizer::load(root_ / "model");
  ASSERT_EQ(images().size(), 1u);
  const auto written = fs::last_write_time(images()[0]);
  const auto second = Tokenizer::load(root_ / "model");
  EXPECT_EQ(fs::last_write_time(images()[0]), written);  // read, not rewritten
  expect_same_as_reference(*first);
  expect_same_as_reference(*second);
}

TEST_F(TokenizerCache, DamagedImageIsIgnoredAndRewritten) {
  Tokenizer::load(root_ / "model");
  ASSERT_EQ(images().size(), 1u);
  const fs::path image = images()[0];
  const auto size = fs::file_size(image);
  for (const auto cut : {size / 2, size - 1, uintmax_t{20}}) {
    fs::resize_file(image, cut);
    const auto t = Tokenizer::load(root_ / "model");
    expect_same_as_reference(*t);
    EXPECT_EQ(fs::file_size(image), size);  // rebuilt
  }
  {  // garbage in the middle of the tables
    std::fstream f(image, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size / 2));
    const std::string junk(4096, '\xff');
    f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  const auto t = Tokenizer::load(root_ / "model");
  expect_same_as_reference(*t);
}

TEST_F(TokenizerCache, EditedTokenizerJsonMakesTheImageStale) {
  Tokenizer::load(root_ / "model");
  const fs::path json = root_ / "model/tokenizer.json";
  // A different vocabulary under the same path (one token more): the image must not be used for it.
  std::string text = test::read_maybe_gzipped(json);
  const std::string from = "\"Hello\":";
  ASSERT_NE(text.find(from), std::string::npos);
  text.insert(text.find(from), "\"zzlatheprobe\": 999999, ");
  std::ofstream(json, std::ios::binary | std::ios::trunc) << text;
  fs::last_write_time(json, fs::last_write_time(json) + std::chrono::seconds(5));
  const auto t = Tokenizer::load(root_ / "model");
  EXPECT_EQ(t->token_to_id("zzlatheprobe"), std::optional<int32_t>(999999));
  EXPECT_EQ(t->vocab_size(), 1000000u);
}

TEST_F(TokenizerCache, OffDisablesIt) {
  ::setenv("LATHE_CACHE_DIR", "off", 1);
  Tokenizer::load(root_ / "model");
  EXPECT_TRUE(images().empty());
}

}  // namespace
}  // namespace lathe
