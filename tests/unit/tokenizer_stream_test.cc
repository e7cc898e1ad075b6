// StreamDecoder: ids pushed one at a time give the same text as decoding them together, and no chunk ever
// holds a partial UTF-8 character (split multi-byte characters, <0xXX> byte-fallback runs).
#include <gtest/gtest.h>

#include "tokenizer/stream_decoder.h"
#include "tokenizer/utf8.h"
#include "tokenizer_fixtures.h"

namespace lathe {
namespace {

struct Streamed {
  std::vector<std::string> chunks;
  std::string text;
};

Streamed stream(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  StreamDecoder d(tok);
  Streamed s;
  for (int32_t id : ids) s.chunks.push_back(d.push(id));
  s.chunks.push_back(d.finish());
  for (const auto& c : s.chunks) s.text += c;
  return s;
}

void expect_streams_like_decode(const Tokenizer& tok, const std::string& text) {
  const auto ids = tok.encode(text);
  const Streamed s = stream(tok, ids);
  EXPECT_EQ(s.text, tok.decode(ids)) << text;
  for (const auto& c : s.chunks) EXPECT_TRUE(utf8::is_valid(c)) << "broken chunk while streaming " << text;
}

TEST(TokenizerStream, ByteLevelHoldsSplitCharactersBack) {
  const Tokenizer& tok = test::fixture_tokenizer("bytebpe");
  const std::string text = "\xF0\x9F\x99\x82\xF0\x9F\x9A\x80 emoji, caf\xC3\xA9, \xE4\xBD\xA0\xE5\xA5\xBD";
  const auto ids = tok.encode(text);
  ASSERT_GT(ids.size(), 10u);  // the tiny vocabulary splits every multi-byte character
  const Streamed s = stream(tok, ids);
  EXPECT_EQ(s.text, text);
  size_t held = 0;
  for (const auto& c : s.chunks) {
    EXPECT_TRUE(utf8::is_valid(c));
    held += c.empty();
  }
  EXPECT_GT(held, 0u);  // some pushes had to wait for the rest of a character
}

TEST(TokenizerStream, ByteFallbackRunCompletesOnItsLastByte) {
  const Tokenizer& tok = test::fixture_tokenizer("spbpe");
  std::vector<int32_t> ids;
  for (const char* b : {"<0xF0>", "<0x9F>", "<0x99>", "<0x82>"}) ids.push_back(tok.token_to_id(b).value());
  StreamDecoder d(tok);
  EXPECT_EQ(d.push(ids[0]), "");
  EXPECT_EQ(d.push(ids[1]), "");
  EXPECT_EQ(d.push(ids[2]), "");
  EXPECT_EQ(d.push(ids[3]), "\xF0\x9F\x99\x82");
  EXPECT_EQ(d.finish(), "");
  expect_streams_like_decode(tok,
                             "\xF0\x9F\x99\x82\xF0\x9F\x9A\x80\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD emoji \xE4\xBD\xA0");
}

TEST(TokenizerStream, UnfinishedRunIsFlushedAsReplacementCharacter) {
  const Tokenizer& tok = test::fixture_tokenizer("spbpe");
  StreamDecoder d(tok);
  EXPECT_EQ(d.push(tok.token_to_id("<0xF0>").value()), "");
  EXPECT_EQ(d.finish(), "\xEF\xBF\xBD");
  // A run that can never complete is released as soon as an ordinary token follows it.
  EXPECT_EQ(d.push(tok.token_to_id("<0xF0>").value()), "");
  const std::string after = d.push(tok.encode("a")[0]);
  EXPECT_EQ(after,
            "\xEF\xBF\xBD"
            "a");
}

TEST(TokenizerStream, StreamingMatchesDecodingForSmallTokenizers) {
  for (const char* name : {"bytebpe", "spbpe"}) {
    const Tokenizer& tok = test::fixture_tokenizer(name);
    for (const auto& c : test::encode_oracle(name)) expect_streams_like_decode(tok, c["text"]);
  }
}

}  // namespace
}  // namespace lathe
