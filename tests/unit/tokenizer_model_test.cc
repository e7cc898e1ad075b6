// The BPE model and added tokens through the whole Tokenizer, on small hand-written tokenizer.json files.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "tokenizer/tokenizer.h"

namespace lathe {
namespace {

using nlohmann::json;

using Merges = std::vector<std::pair<std::string, std::string>>;
json merges_json(const Merges& merges) {
  json out = json::array();
  for (const auto& [a, b] : merges) out.push_back(json::array({a, b}));
  return out;
}

// A character vocabulary (ids in order) plus merge results, with the given extra tokenizer.json members.
std::unique_ptr<Tokenizer> make(const std::vector<std::string>& chars, const Merges& merge_list,
                                json extra = json::object(), json model_extra = json::object()) {
  const json merges = merges_json(merge_list);
  json vocab = json::object();
  for (const auto& c : chars) vocab[c] = vocab.size();
  for (const auto& m : merges) {
    const std::string joined = m[0].get<std::string>() + m[1].get<std::string>();
    if (!vocab.contains(joined)) vocab[joined] = vocab.size();
  }
  json model = {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}};
  model.update(model_extra);
  json doc = {{"model", model}, {"added_tokens", json::array()}};
  doc.update(extra);
  return Tokenizer::from_json(doc.dump());
}

std::vector<std::string> tokens(const Tokenizer& t, const std::string& text) {
  std::vector<std::string> out;
  for (int32_t id : t.encode(text)) out.push_back(t.id_to_token(id).value_or("?"));
  return out;
}

using Strings = std::vector<std::string>;

TEST(TokenizerBpe, MergesApplyByRankNotByPosition) {
  // "abc": (b,c) has the better rank, so it wins over (a,b) even though (a,b) is leftmost.
  auto t = make({"a", "b", "c"}, {{"b", "c"}, {"a", "b"}});
  EXPECT_EQ(tokens(*t, "abc"), (Strings{"a", "bc"}));
  auto u = make({"a", "b", "c"}, {{"a", "b"}, {"b", "c"}});
  EXPECT_EQ(tokens(*u, "abc"), (Strings{"ab", "c"}));
  // Equal pairs: leftmost first.
  auto v = make({"a"}, {{"a", "a"}});
  EXPECT_EQ(tokens(*v, "aaa"), (Strings{"aa", "a"}));
}

TEST(TokenizerBpe, UnknownCharactersUnkFuseAndByteFallback) {
  auto dropped = make({"a"}, Merges{});
  EXPECT_EQ(tokens(*dropped, "axa"), (Strings{"a", "a"}));  // no unk token: unknown characters vanish
  auto unk = make({"<unk>", "a"}, Merges{}, json::object(), {{"unk_token", "<unk>"}});
  EXPECT_EQ(tokens(*unk, "axya"), (Strings{"a", "<unk>", "<unk>", "a"}));
  auto fused = make({"<unk>", "a"}, Merges{}, json::object(), {{"unk_token", "<unk>"}, {"fuse_unk", true}});
  EXPECT_EQ(tokens(*fused, "axya"), (Strings{"a", "<unk>", "a"}));
  auto bytes = make({"<unk>", "a", "<0xC3>", "<0xA9>"}, Merges{}, json::object(),
                    {{"unk_token", "<unk>"}, {"byte_fallback", true}});
  EXPECT_EQ(tokens(*bytes, "a\xC3\xA9x"), (Strings{"a", "<0xC3>", "<0xA9>", "<unk>"}));
}

TEST(TokenizerBpe, IgnoreMergesTakesWholeWordsFromTheVocabulary) {
  // "abc" is in the vocabulary but no merge path builds it.
  auto normal = make({"a", "b", "c", "abc"}, {{"a", "b"}});
  EXPECT_EQ(tokens(*normal, "abc"), (Strings{"ab", "c"}));
  auto ignoring = make({"a", "b", "c", "abc"}, {{"a", "b"}}, json::object(), {{"ignore_merges", true}});
  EXPECT_EQ(tokens(*ignoring, "abc"), (Strings{"abc"}));
}

TEST(TokenizerBpe, LegacyMergeStringsAndSubwordPrefix) {
  json doc = json::parse(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}})");
  EXPECT_EQ(Tokenizer::from_json(doc.dump())->encode("ab"), (std::vector<int32_t>{2}));
  // With a continuing-subword prefix, a merge drops the right side's prefix: a + ##b -> ab.
  json prefixed = json::parse(R"({"model": {"type": "BPE", "vocab": {"a": 0, "##b": 1, "##c": 2, "ab": 3},
                                            "merges": [["a", "##b"]], "continuing_subword_prefix": "##"}})");
  EXPECT_EQ(Tokenizer::from_json(prefixed.dump())->encode("abc"), (std::vector<int32_t>{3, 2}));
}

json added(int id, const std::string& content, json flags = json::object()) {
  json t = {{"id", id},        {"content", content},   {"special", false},   {"lstrip", false},
            {"rstrip", false}, {"single_word", false}, {"normalized", false}};
  t.update(flags);
  return t;
}

TEST(TokenizerAddedTokens, StripSingleWordAndSpecialHandling) {
  const Strings chars = {"a", "b", "x", " ", "<", ">", "/"};
  auto t = make(chars, Merges{},
                {{"added_tokens",
                  {added(100, "<t>", {{"lstrip", true}}), added(101, "</t>", {{"rstrip", true}}),
                   added(102, "ab", {{"single_word", true}}), added(103, "<s>", {{"special", true}})}}});
  EXPECT_EQ(tokens(*t, "a <t> b"), (Strings{"a", "<t>", " ", "b"}));
  EXPECT_EQ(tokens(*t, "a </t> b"), (Strings{"a", " ", "</t>", "b"}));
  EXPECT_EQ(tokens(*t, "ab xab ab"), (Strings{"ab", " ", "x", "a", "b", " ", "ab"}));
  EXPECT_EQ(t->encode("<s>a"), (std::vector<int32_t>{103, 0}));
  EXPECT_EQ(t->decode(std::vector<int32_t>{103, 0}, false), "<s> a");  // no decoder: tokens joined by spaces
  EXPECT_EQ(t->decode(std::vector<int32_t>{103, 0}, true), "a");
  EXPECT_TRUE(t->is_special(103));
  EXPECT_FALSE(t->is_special(100));
  EXPECT_EQ(t->token_to_id("</t>"), 101);
  EXPECT_EQ(t->vocab_size(), 104u);
}

TEST(TokenizerAddedTokens, NormalizedTokensMatchAfterNormalization) {
  const Strings chars = {"<", ">", "y", "z"};
  auto t =
      make(chars, Merges{},
           {{"normalizer", {{"type", "Lowercase"}}},
            {"added_tokens", {added(50, "<Y>", {{"normalized", false}}), added(51, "<Z>", {{"normalized", true}})}}});
  EXPECT_EQ(t->encode("<Y>"), (std::vector<int32_t>{50}));
  EXPECT_EQ(tokens(*t, "<y>"), (Strings{"<", "y", ">"}));  // raw-matched tokens are case-exact
  EXPECT_EQ(t->encode("<Z>"), (std::vector<int32_t>{51}));
  EXPECT_EQ(t->encode("<z>"), (std::vector<int32_t>{51}));
}

// encode_capped keeps the ids encode() gives up to the cap, counts all of them, and never holds or reserves more
// than the cap (words of several ids straddle it; added tokens and plain words alternate).
TEST(TokenizerCapped, KeepsThePrefixCountsTheWholeAndNeverGrowsPastTheCap) {
  auto t = make({"a", "b", " "}, {{"a", "b"}, {"ab", "ab"}},
                {{"pre_tokenizer", {{"type", "WhitespaceSplit"}}}, {"added_tokens", {added(50, "<s>")}}});
  std::string text;
  for (int i = 0; i < 300; ++i) text += i % 7 ? "abababa b " : "<s>aab";
  const std::vector<int32_t> all = t->encode(text);
  ASSERT_GT(all.size(), 600u);
  for (size_t cap : {size_t{0}, size_t{1}, size_t{2}, size_t{3}, size_t{17}, all.size() - 1, all.size(), all.size() + 1,
                     size_t{1} << 40}) {
    std::vector<int32_t> ids(5000, 7);  // replaced, its room given back where it exceeds the cap
    EXPECT_EQ(t->encode_capped(text, cap, ids), all.size()) << cap;
    const size_t kept = std::min(cap, all.size());
    EXPECT_EQ(ids, std::vector<int32_t>(all.begin(), all.begin() + static_cast<ptrdiff_t>(kept))) << cap;
    EXPECT_LE(ids.capacity(), cap) << cap;
  }
  std::vector<int32_t> none;
  EXPECT_EQ(t->encode_capped("", 4, none), 0u);
  EXPECT_TRUE(none.empty());
}

// encode_special_capped counts what encode(text, true) gives (the post-processor's BOS and EOS included) and
// keeps all of it when that fits the cap: a completions prompt past the context is sized, not held.
TEST(TokenizerCapped, SpecialCountIncludesThePostProcessorsTokens) {
  const json post = {{"type", "TemplateProcessing"},
                     {"single",
                      {{{"SpecialToken", {{"id", "<b>"}, {"type_id", 0}}}},
                       {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                       {{"SpecialToken", {{"id", "<e>"}, {"type_id", 0}}}}}},
                     {"special_tokens",
                      {{"<b>", {{"id", "<b>"}, {"ids", {60}}, {"tokens", {"<b>"}}}},
                       {"<e>", {{"id", "<e>"}, {"ids", {61}}, {"tokens", {"<e>"}}}}}}};
  auto t = make({"a", "b", " "}, {{"a", "b"}},
                {{"pre_tokenizer", {{"type", "WhitespaceSplit"}}},
                 {"added_tokens", {added(60, "<b>"), added(61, "<e>")}},
                 {"post_processor", post}});
  std::string text;
  for (int i = 0; i < 40; ++i) text += "ab a ";
  const std::vector<int32_t> all = t->encode(text, true);
  ASSERT_EQ(all.front(), 60);
  ASSERT_EQ(all.back(), 61);
  for (size_t cap : {size_t{1}, size_t{5}, all.size() - 2, all.size() - 1, all.size(), all.size() + 3}) {
    std::vector<int32_t> ids;
    EXPECT_EQ(t->encode_special_capped(text, cap, ids), all.size()) << cap;
    EXPECT_LE(ids.size(), cap) << cap;
    if (cap >= all.size()) {
      EXPECT_EQ(ids, all) << cap;
    }
  }
  auto plain = make({"a", "b", " "}, {{"a", "b"}}, {{"pre_tokenizer", {{"type", "WhitespaceSplit"}}}});
  std::vector<int32_t> ids;
  EXPECT_EQ(plain->encode_special_capped(text, 7, ids), plain->encode(text, true).size());
  EXPECT_EQ(ids.size(), 7u);
}

TEST(TokenizerConfig, SpecialTokensFromTokenizerConfig) {
  json doc = {{"model", {{"type", "BPE"}, {"vocab", {{"a", 0}}}, {"merges", json::array()}}},
              {"added_tokens", {added(1, "<bos>", {{"special", true}}), added(2, "<eos>", {{"special", true}})}}};
  const json config = {{"bos_token", "<bos>"}, {"eos_token", {{"content", "<eos>"}}}, {"add_bos_token", true}};
  auto t = Tokenizer::from_json(doc.dump(), config.dump());
  EXPECT_EQ(t->bos_id(), 1);
  EXPECT_EQ(t->eos_id(), 2);
  EXPECT_TRUE(t->special_tokens().add_bos_token);
  EXPECT_FALSE(t->special_tokens().add_eos_token);
}

}  // namespace
}  // namespace lathe
