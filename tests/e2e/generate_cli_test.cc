// `lathe generate --chat` end to end: the real binary, the fixture's tokenizer and chat template, greedy
// decoding; stdout must be exactly the decoded reference continuation.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <string>

#include "support/fixtures.h"
#include "tokenizer/tokenizer.h"

namespace lathe {
namespace {

struct Output {
  std::string out;
  int status;
};

Output run(const std::string& args) {
  const std::string cmd = std::string(LATHE_BINARY) + " " + args + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  Output o{"", -1};
  if (!p) return o;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) o.out.append(buf.data(), n);
  o.status = pclose(p);
  return o;
}

TEST(GenerateCli, GreedyChatPrintsTheReferenceContinuation) {
  const std::string model = test::model_dir("qwen3-q4g64");
  const auto ref = test::load_reference("qwen3-q4g64");
  const auto tok = Tokenizer::load(model);
  const std::string expected = tok->decode(ref.greedy, /*skip_special=*/true);
  const Output o =
      run("generate --model " + model + " --chat --prompt 'Write a haiku about the sea.' --temp 0 --max-tokens " +
          std::to_string(ref.greedy.size()));
  EXPECT_EQ(o.status, 0);
  EXPECT_EQ(o.out, expected);
}

TEST(GenerateCli, DemoModelAnswersInUpperCase) {
  const Output o = run("generate --model " + std::string(LATHE_SOURCE_DIR) +
                       "/models/demo --chat --prompt 'hello world' --max-tokens 16");
  EXPECT_EQ(o.status, 0);
  EXPECT_EQ(o.out, "HELLO WORLD");
}

TEST(GenerateCli, DenseWeightsFlagTakesModesAndSizes) {
  const std::string demo =
      "generate --model " + std::string(LATHE_SOURCE_DIR) + "/models/demo --prompt hi --max-tokens 2";
  for (const char* v : {"auto", "on", "off", "8G", "123456"})
    EXPECT_EQ(run(demo + " --cuda-dense-weights " + v).status, 0) << v;  // a no-op on the CPU, but accepted
  for (const char* v : {"lots", "8GB", "-1"}) EXPECT_NE(run(demo + " --cuda-dense-weights " + v).status, 0) << v;
}

TEST(GenerateCli, BadModelDirectoryIsAClearError) {
  const Output o = run("generate --model /nonexistent --prompt hi");
  EXPECT_NE(o.status, 0);
}

}  // namespace
}  // namespace lathe
