// `lathe generate --chat` end to end: the real binary, the fixture's tokenizer and chat template, greedy
// decoding; stdout must be exactly the decoded reference continuation.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <string>

#include "support/cli_run.h"
#include "support/fixtures.h"
#include "tokenizer/tokenizer.h"

namespace lathe {
namespace {

TEST(GenerateCli, GreedyChatPrintsTheReferenceContinuation) {
  const std::string model = test::model_dir("qwen3-q4g64");
  const auto ref = test::load_reference("qwen3-q4g64");
  const auto tok = Tokenizer::load(model);
  const std::string expected = tok->decode(ref.greedy, /*skip_special=*/true);
  const testutil::CliOutput o = testutil::run_lathe(
      "generate --model " + model + " --chat --prompt 'Write a haiku about the sea.' --temp 0 --max-tokens " +
          std::to_string(ref.greedy.size()),
      false);
  EXPECT_EQ(o.status, 0);
  EXPECT_EQ(o.out, expected);
}

TEST(GenerateCli, DemoModelAnswersInUpperCase) {
  const testutil::CliOutput o = testutil::run_lathe("generate --model " + std::string(LATHE_SOURCE_DIR) +
                                                        "/models/demo --chat --prompt 'hello world' --max-tokens 16",
                                                    false);
  EXPECT_EQ(o.status, 0);
  EXPECT_EQ(o.out, "HELLO WORLD");
}

TEST(GenerateCli, DenseWeightsFlagTakesModesAndSizes) {
  const std::string demo =
      "generate --model " + std::string(LATHE_SOURCE_DIR) + "/models/demo --prompt hi --max-tokens 2";
  for (const char* v : {"auto", "on", "off", "8G", "123456"})
    EXPECT_EQ(testutil::run_lathe(demo + " --cuda-dense-weights " + v, false).status, 0)
        << v;  // a no-op on the CPU, but accepted
  for (const char* v : {"lots", "8GB", "-1"})
    EXPECT_NE(testutil::run_lathe(demo + " --cuda-dense-weights " + v, false).status, 0) << v;
}

TEST(GenerateCli, BadModelDirectoryIsAClearError) {
  const testutil::CliOutput o = testutil::run_lathe("generate --model /nonexistent --prompt hi", false);
  EXPECT_NE(o.status, 0);
}

}  // namespace
}  // namespace lathe
