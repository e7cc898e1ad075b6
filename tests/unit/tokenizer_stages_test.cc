// Each tokenizer.json stage on its own: normalizers, pre-tokenizers (every split behaviour, invert),
// decoders and post-processors, with expectations written from the HF tokenizers semantics.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pre_tokenizer.h"

namespace lathe {
namespace {

using nlohmann::json;
using Words = std::vector<std::string>;

std::string normalize(const json& spec, const std::string& text) {
  return make_normalizer(JsonAt(spec, "normalizer"))->normalize(text);
}

Words pre_tokenize(const json& spec, const std::string& text, bool at_start = true) {
  Words out;
  make_pre_tokenizer(JsonAt(spec, "pre_tokenizer"))->split(text, at_start, [&](std::string_view w) {
    out.emplace_back(w);
  });
  return out;
}

std::string decode(const json& spec, const Words& tokens) {
  std::string out;
  for (const auto& s : make_decoder(JsonAt(spec, "decoder"))->decode_chain(tokens)) out += s;
  return out;
}

json split(const json& pattern, const char* behavior, bool invert = false) {
  return {{"type", "Split"}, {"pattern", pattern}, {"behavior", behavior}, {"invert", invert}};
}

TEST(TokenizerNormalizer, UnicodeFormsLowercaseStripPrependReplaceSequence) {
  EXPECT_EQ(normalize({{"type", "NFC"}}, "e\xCC\x81"), "\xC3\xA9");  // e + combining acute -> é
  EXPECT_EQ(normalize({{"type", "NFD"}}, "\xC3\xA9"), "e\xCC\x81");
  EXPECT_EQ(normalize({{"type", "NFKC"}}, "\xEF\xAC\x81 \xE2\x91\xA0"), "fi 1");  // ligature fi, circled 1
  EXPECT_EQ(normalize({{"type", "NFKD"}}, "\xEF\xAC\x81\xC3\xA9"), "fie\xCC\x81");
  EXPECT_EQ(normalize({{"type", "Lowercase"}},
                      "\xC3\x80"
                      "Bc"),
            "\xC3\xA0"
            "bc");  // ÀBc -> àbc
  EXPECT_EQ(normalize({{"type", "Strip"}, {"strip_left", true}, {"strip_right", false}}, " \t a b \n"), "a b \n");
  EXPECT_EQ(normalize({{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}}, "\xE3\x80\x80x "), "x");
  EXPECT_EQ(normalize({{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}}, "hi"), "\xE2\x96\x81hi");
  EXPECT_EQ(normalize({{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}}, ""), "");
  EXPECT_EQ(normalize({{"type", "Replace"}, {"pattern", {{"Regex", "\\s+"}}}, {"content", "_"}}, "a  b\tc"), "a_b_c");
  const json seq = {{"type", "Sequence"},
                    {"normalizers",
                     {{{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}},
                      {{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}},
                      {{"type", "Lowercase"}}}}};
  EXPECT_EQ(normalize(seq, "Hi There"), "\xE2\x96\x81hi\xE2\x96\x81there");
}

TEST(TokenizerPreTokenizer, SplitBehaviours) {
  const json dash = {{"String", "-"}};
  EXPECT_EQ(pre_tokenize(split(dash, "Removed"), "a-b--c"), (Words{"a", "b", "c"}));
  EXPECT_EQ(pre_tokenize(split(dash, "Isolated"), "a-b--c"), (Words{"a", "-", "b", "-", "-", "c"}));
  EXPECT_EQ(pre_tokenize(split(dash, "MergedWithPrevious"), "a-b--c"), (Words{"a-", "b-", "-", "c"}));
  EXPECT_EQ(pre_tokenize(split(dash, "MergedWithNext"), "a-b--c"), (Words{"a", "-b", "-", "-c"}));
  EXPECT_EQ(pre_tokenize(split(dash, "Contiguous"), "a-b--c"), (Words{"a", "-", "b", "--", "c"}));
  EXPECT_EQ(pre_tokenize(split(dash, "Removed"), ""), Words{});
}

TEST(TokenizerPreTokenizer, SplitInvertKeepsTheMatches) {
  const json letters = {{"Regex", "\\p{L}+"}};
  EXPECT_EQ(pre_tokenize(split(letters, "Removed"), "ab, cd!"), (Words{", ", "!"}));
  EXPECT_EQ(pre_tokenize(split(letters, "Removed", true), "ab, cd!"), (Words{"ab", "cd"}));
  EXPECT_EQ(pre_tokenize(split(letters, "MergedWithPrevious", true), "ab, cd!"), (Words{"ab, ", "cd!"}));
}

TEST(TokenizerPreTokenizer, RegexUsesUnicodeProperties) {
  const json words = split({{"Regex", "\\p{L}+|\\p{N}|\\s+"}}, "Isolated");
  EXPECT_EQ(pre_tokenize(words, "caf\xC3\xA9 42"), (Words{"caf\xC3\xA9", " ", "4", "2"}));
}

TEST(TokenizerPreTokenizer, ByteLevelWithAndWithoutRegex) {
  const json with_regex = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  EXPECT_EQ(pre_tokenize(with_regex, "hi  you\n"), (Words{"\xC4\xA0hi", "\xC4\xA0", "\xC4\xA0you", "\xC4\x8A"}));
  const json no_regex = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  EXPECT_EQ(pre_tokenize(no_regex, "hi you"), (Words{"hi\xC4\xA0you"}));
  EXPECT_EQ(pre_tokenize(no_regex, "\xC3\xA9"), (Words{"\xC3\x83\xC2\xA9"}));  // bytes C3 A9 as characters
}

TEST(TokenizerPreTokenizer, MetaspacePrependSchemes) {
  const std::string m = "\xE2\x96\x81";
  json spec = {{"type", "Metaspace"}, {"replacement", m}, {"prepend_scheme", "always"}, {"split", true}};
  EXPECT_EQ(pre_tokenize(spec, "hi you"), (Words{m + "hi", m + "you"}));
  EXPECT_EQ(pre_tokenize(spec, "hi you", false), (Words{m + "hi", m + "you"}));
  spec["prepend_scheme"] = "first";
  EXPECT_EQ(pre_tokenize(spec, "hi you", true), (Words{m + "hi", m + "you"}));
  EXPECT_EQ(pre_tokenize(spec, "hi you", false), (Words{"hi", m + "you"}));
  spec["prepend_scheme"] = "never";
  EXPECT_EQ(pre_tokenize(spec, "hi you"), (Words{"hi", m + "you"}));
  spec["split"] = false;
  EXPECT_EQ(pre_tokenize(spec, "hi you"), (Words{"hi" + m + "you"}));
}

TEST(TokenizerPreTokenizer, DigitsPunctuationWhitespaceSequence) {
  EXPECT_EQ(pre_tokenize({{"type", "Digits"}, {"individual_digits", true}}, "a123b"), (Words{"a", "1", "2", "3", "b"}));
  EXPECT_EQ(pre_tokenize({{"type", "Digits"}, {"individual_digits", false}}, "a123b"), (Words{"a", "123", "b"}));
  EXPECT_EQ(pre_tokenize({{"type", "Punctuation"}}, "hi!? \xE3\x80\x82"), (Words{"hi", "!", "?", " ", "\xE3\x80\x82"}));
  EXPECT_EQ(pre_tokenize({{"type", "Punctuation"}, {"behavior", "Contiguous"}}, "hi!?"), (Words{"hi", "!?"}));
  EXPECT_EQ(pre_tokenize({{"type", "Whitespace"}}, "hi  there!! x"), (Words{"hi", "there", "!!", "x"}));
  EXPECT_EQ(pre_tokenize({{"type", "WhitespaceSplit"}}, " a\tb  c "), (Words{"a", "b", "c"}));
  const json seq = {
      {"type", "Sequence"},
      {"pretokenizers", {{{"type", "WhitespaceSplit"}}, {{"type", "Digits"}, {"individual_digits", true}}}}};
  EXPECT_EQ(pre_tokenize(seq, "ab12 c3"), (Words{"ab", "1", "2", "c", "3"}));
}

TEST(TokenizerDecoder, ByteLevelMapsCharactersBackToBytes) {
  const json bl = {{"type", "ByteLevel"}};
  EXPECT_EQ(decode(bl, {"\xC4\xA0hi", "\xC3\x83", "\xC2\xA9"}), " hi\xC3\xA9");
  EXPECT_EQ(decode(bl, {"<|end|>\n", "ok"}), "<|end|>\nok");  // a token outside the table passes as-is
  EXPECT_EQ(decode(bl, {"\xC3\x83"}), "\xEF\xBF\xBD");        // a lone lead byte becomes U+FFFD
}

TEST(TokenizerDecoder, ByteFallbackFuseReplaceStripMetaspace) {
  const std::string m = "\xE2\x96\x81";
  const json gemma = {{"type", "Sequence"},
                      {"decoders",
                       {{{"type", "Replace"}, {"pattern", {{"String", m}}}, {"content", " "}},
                        {{"type", "ByteFallback"}},
                        {{"type", "Fuse"}}}}};
  EXPECT_EQ(decode(gemma, {m + "I", m + "saw", "<0xF0>", "<0x9F>", "<0x99>", "<0x82>", "!"}),
            " I saw\xF0\x9F\x99\x82!");
  // An invalid run becomes one U+FFFD per byte.
  EXPECT_EQ(decode(gemma, {"a", "<0xF0>", "<0x9F>", "b"}),
            "a\xEF\xBF\xBD\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(decode({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}, {"  a ", " b"}), " a b");
  EXPECT_EQ(decode({{"type", "Metaspace"}, {"replacement", m}, {"prepend_scheme", "always"}}, {m + "hi", m + "you"}),
            "hi you");
  EXPECT_EQ(decode({{"type", "Metaspace"}, {"replacement", m}, {"prepend_scheme", "never"}}, {m + "hi", m + "you"}),
            " hi you");
}

TEST(TokenizerPostProcessor, TemplateProcessingAddsSpecialTokens) {
  const json spec = {{"type", "TemplateProcessing"},
                     {"single",
                      {{{"SpecialToken", {{"id", "<bos>"}, {"type_id", 0}}}},
                       {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                       {{"SpecialToken", {{"id", "<eos>"}, {"type_id", 0}}}}}},
                     {"special_tokens",
                      {{"<bos>", {{"id", "<bos>"}, {"ids", {2}}, {"tokens", {"<bos>"}}}},
                       {"<eos>", {{"id", "<eos>"}, {"ids", {1}}, {"tokens", {"<eos>"}}}}}}};
  EXPECT_EQ(make_post_processor(JsonAt(spec, "post_processor"))->process({7, 8}), (std::vector<int32_t>{2, 7, 8, 1}));
  const json bytelevel = {{"type", "ByteLevel"}, {"trim_offsets", false}};
  EXPECT_EQ(make_post_processor(JsonAt(bytelevel, "post_processor"))->process({7}), (std::vector<int32_t>{7}));
}

}  // namespace
}  // namespace lathe
