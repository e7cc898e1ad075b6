// `lathe tokenize` end to end: ids as a JSON array, --special, and --decode back to the exact text.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer_fixtures.h"

namespace lathe {
namespace {

// Runs a shell command and returns its stdout.
std::string run(const std::string& command) {
  std::string out;
  FILE* p = popen(command.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

std::string tokenize(const std::string& args) {
  return run(std::string(LATHE_BINARY) + " tokenize --tokenizer " + test::tokenizer_fixture_dir("spbpe").string() +
             " " + args);
}

TEST(TokenizeCli, EncodesDecodesAndAddsNoSpecialTokensWithoutATemplate) {
  const nlohmann::json oracle = test::encode_oracle("spbpe");
  const auto& hello = oracle[0];
  ASSERT_EQ(hello["text"], "Hello world");
  EXPECT_EQ(nlohmann::json::parse(tokenize("'Hello world'")), hello["ids"]);
  EXPECT_EQ(nlohmann::json::parse(tokenize("--special 'Hello world'")), hello["ids_with_special"]);
  EXPECT_EQ(nlohmann::json::parse(run("printf 'Hello world' | " + std::string(LATHE_BINARY) + " tokenize --tokenizer " +
                                      test::tokenizer_fixture_dir("spbpe").string() + " -")),
            hello["ids"]);
  EXPECT_EQ(tokenize("--decode '" + hello["ids"].dump() + "'"), "Hello world");
}

}  // namespace
}  // namespace lathe
