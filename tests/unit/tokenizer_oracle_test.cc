// Encode/decode parity with HF tokenizers 0.23 on the oracle texts, for the four fixture tokenizers (the real
// ones are loaded once, so streaming parity is checked here too).
#include <gtest/gtest.h>

#include "tokenizer/stream_decoder.h"
#include "tokenizer_fixtures.h"

namespace lathe {
namespace {

struct OracleCase {
  const char* tokenizer;  // fixture directory under tests/fixtures/tokenizers
  const char* oracle;     // oracles/<name>.encode.json
};

class TokenizerOracle : public ::testing::TestWithParam<OracleCase> {};

TEST_P(TokenizerOracle, EveryCaseMatchesIdsSpecialIdsAndDecoding) {
  const Tokenizer& tok = test::fixture_tokenizer(GetParam().tokenizer);
  const nlohmann::json cases = test::encode_oracle(GetParam().oracle);
  ASSERT_FALSE(cases.empty());
  size_t passed = 0;
  for (const auto& c : cases) {
    const std::string text = c["text"];
    const auto want_ids = c["ids"].get<std::vector<int32_t>>();
    const auto want_special = c["ids_with_special"].get<std::vector<int32_t>>();
    const std::string want_decoded = c["decoded"];
    const auto ids = tok.encode(text, false);
    const auto ids_special = tok.encode(text, true);
    const std::string decoded = tok.decode(ids);
    EXPECT_EQ(ids, want_ids) << "ids for " << nlohmann::json(text).dump();
    EXPECT_EQ(ids_special, want_special) << "ids_with_special for " << nlohmann::json(text).dump();
    EXPECT_EQ(decoded, want_decoded) << "decoded for " << nlohmann::json(text).dump();
    passed += ids == want_ids && ids_special == want_special && decoded == want_decoded;
    // The streaming detokenizer, fed one id at a time, ends with the same text.
    StreamDecoder stream(tok);
    std::string streamed;
    for (int32_t id : ids) streamed += stream.push(id);
    streamed += stream.finish();
    EXPECT_EQ(streamed, decoded) << "streamed decoding of " << nlohmann::json(text).dump();
  }
  EXPECT_EQ(passed, cases.size());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TokenizerOracle,
                         ::testing::Values(OracleCase{"bytebpe", "bytebpe"}, OracleCase{"spbpe", "spbpe"},
                                           OracleCase{"qwen3-real", "qwen3"}, OracleCase{"gemma3-real", "gemma3"}),
                         [](const auto& info) { return std::string(info.param.oracle); });

}  // namespace
}  // namespace lathe
