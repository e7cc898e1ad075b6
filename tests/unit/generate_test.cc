// The generation loop on a fixture model: greedy equals the reference continuation, limits and EOS stop it,
// cancellation stops it, and chunked prefill changes nothing.
#include <gtest/gtest.h>

#include "engine/generate.h"
#include "support/fixtures.h"

namespace lathe {
namespace {

// Text is the decimal id followed by a space: enough to exercise stop strings without a tokenizer.
class IdText : public IncrementalDecoder {
 public:
  std::string push(int32_t id) override { return std::to_string(id) + " "; }
  std::string flush() override { return ""; }
};

class Generate : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = load_model(test::model_dir("qwen3-q4g64")).release();
    ref_ = new test::Reference(test::load_reference("qwen3-q4g64"));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete ref_;
  }
  GenerateResult run(const GenerateOptions& o, const std::function<void(const GeneratedToken&)>& cb = {}) {
    CacheList cache = model_->make_cache();
    IdText dec;
    return generate(*model_, cache, ref_->prompts.at("chat"), o, dec, cb);
  }
  static Model* model_;
  static test::Reference* ref_;
};
Model* Generate::model_ = nullptr;
test::Reference* Generate::ref_ = nullptr;

TEST_F(Generate, GreedyMatchesReferenceWithChunkedPrefill) {
  GenerateOptions o;
  o.max_tokens = 20;
  o.prefill_chunk = 7;
  const auto r = run(o);
  EXPECT_EQ(r.tokens, ref_->greedy);
  EXPECT_EQ(r.finish_reason, "length");
  EXPECT_EQ(r.prompt_tokens, static_cast<int>(ref_->prompts.at("chat").size()));
}

TEST_F(Generate, EosStopsAndIsNotInTheText) {
  GenerateOptions o;
  o.max_tokens = 20;
  o.eos_ids = {ref_->greedy[2]};
  const auto r = run(o);
  EXPECT_EQ(r.tokens.size(), 3u);
  EXPECT_EQ(r.finish_reason, "stop");
  EXPECT_EQ(r.text, std::to_string(ref_->greedy[0]) + " " + std::to_string(ref_->greedy[1]) + " ");
}

TEST_F(Generate, StopStringAcrossTokensEndsGeneration) {
  GenerateOptions o;
  o.max_tokens = 20;
  const std::string second = std::to_string(ref_->greedy[1]);
  o.stop = {" " + second};  // spans the end of token 0's text and token 1's
  const auto r = run(o);
  EXPECT_EQ(r.finish_reason, "stop");
  EXPECT_EQ(r.text, std::to_string(ref_->greedy[0]));
}

TEST_F(Generate, CancellationStopsAtTheNextToken) {
  GenerateOptions o;
  o.max_tokens = 20;
  std::atomic<bool> cancel{false};
  o.cancel = &cancel;
  int seen = 0;
  const auto r = run(o, [&](const GeneratedToken&) {
    if (++seen == 4) cancel = true;
  });
  EXPECT_EQ(r.finish_reason, "cancelled");
  EXPECT_EQ(r.tokens.size(), 4u);
}

}  // namespace
}  // namespace lathe
