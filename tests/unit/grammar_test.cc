// The grammar engine: GBNF parsing, JSON schema → grammar, and token masks over a real vocabulary (the
// Qwen3 fixture tokenizer) driven token by token through the sampler's constraint hook.
#include <gtest/gtest.h>

#include <chrono>
#include <limits>

#include "chat/grammar/gbnf.h"
#include "chat/grammar/grammar_constraint.h"
#include "chat/grammar/grammar_matcher.h"
#include "chat/grammar/json_schema.h"
#include "common/error.h"
#include "engine/sampler.h"
#include "tokenizer_fixtures.h"

namespace lathe::grammar {
namespace {

using ojson = nlohmann::ordered_json;

bool gbnf_accepts(const std::string& g, const std::string& text) { return grammar_accepts(parse_gbnf(g), text); }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Gbnf, LiteralsClassesGroupsAndRepetition) {
  const std::string g = R"(root ::= "ab" [0-9]+ ( "x" | "yz" )? tail   # comment
tail ::= [^a-c]{2,3} "."
)";
  EXPECT_TRUE(gbnf_accepts(g, "ab7dd."));
  EXPECT_TRUE(gbnf_accepts(g, "ab12yzddd."));
  EXPECT_TRUE(gbnf_accepts(g, "ab1xzz."));
  EXPECT_FALSE(gbnf_accepts(g, "ab7dddd."));  // {2,3}
  EXPECT_FALSE(gbnf_accepts(g, "abx dd."));   // + needs a digit
  EXPECT_FALSE(gbnf_accepts(g, "ab1ad."));    // [^a-c]
  EXPECT_FALSE(gbnf_accepts(g, "ab1dd"));     // incomplete
  EXPECT_TRUE(gbnf_accepts(R"(root ::= "\u00e9\x41\n" .)",
                           "\xC3\xA9"
                           "A\n\xE2\x82\xAC"));
  EXPECT_TRUE(gbnf_accepts("root ::= item*\nitem ::= \"a\" item | \"b\"", "aabab"));
}

TEST(Gbnf, ErrorsSayWhatAndWhere) {
  EXPECT_NE(error_of([] { parse_gbnf("root ::= foo"); }).find("rule foo is not defined"), std::string::npos);
  EXPECT_NE(error_of([] { parse_gbnf("x ::= \"a\""); }).find("no root rule"), std::string::npos);
  EXPECT_NE(error_of([] { parse_gbnf("root ::= root \"a\" | \"b\""); }).find("left-recursive"), std::string::npos);
  EXPECT_NE(error_of([] { parse_gbnf("root ::= \"a\"\n\nroot ::= [b-a]"); }).find("line 3"), std::string::npos);
  EXPECT_NE(error_of([] { parse_gbnf("root ::= \"abc"); }).find("unterminated"), std::string::npos);
  EXPECT_NE(error_of([] { parse_gbnf("root ::= \"a\"{5000}"); }).find("repetition count"), std::string::npos);
  EXPECT_NE(error_of([] { parse_gbnf(std::string(300 * 1024, ' ')); }).find("limit"), std::string::npos);
}

TEST(Gbnf, HostileInputHitsLimitsNotTheStack) {
  EXPECT_NE(error_of([] {
              parse_gbnf("root ::= " + std::string(200, '(') + "\"a\"" + std::string(200, ')'));
            }).find("nested deeper"),
            std::string::npos);
  // A schema that reaches itself before reading anything can never produce a character: rejected, naming the
  // $ref, not expanded forever (directly, through $defs, or through an anyOf branch).
  auto cycle = [](const char* schema) {
    return error_of([&] { parse_gbnf(json_schema_to_gbnf(ojson::parse(schema), "s")); });
  };
  EXPECT_NE(cycle(R"({"$ref":"#"})").find("s.$ref.$ref: $ref # leads back to itself"), std::string::npos);
  EXPECT_NE(cycle(R"({"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})")
                .find("$ref #/$defs/a leads back to itself"),
            std::string::npos);
  EXPECT_NE(cycle(R"({"anyOf":[{"type":"null"},{"$ref":"#"}]})").find("leads back to itself"), std::string::npos);
  // Recursion through a value that reads "[" or "{" first is a tree, and stays allowed.
  EXPECT_EQ(cycle(R"({"anyOf":[{"type":"null"},{"type":"array","items":{"$ref":"#"}}]})"), "");
  EXPECT_EQ(cycle(R"({"type":"object","properties":{"c":{"anyOf":[{"$ref":"#"},{"type":"null"}]}}})"), "");
  ojson deep = ojson::parse(R"({"type":"string"})");
  for (int i = 0; i < 100; ++i) deep = {{"type", "array"}, {"items", deep}};
  EXPECT_NE(error_of([&] { json_schema_to_gbnf(deep, "s"); }).find("deeper than 64"), std::string::npos);
  // Ambiguity is bounded: a grammar with exponentially many readings still matches in bounded work.
  const Grammar g = parse_gbnf("root ::= x*\nx ::= \"a\" | \"a\" | \"aa\" | y\ny ::= \"a\"");
  EXPECT_TRUE(grammar_accepts(g, std::string(200, 'a')));
  // Nested nullable repetitions branch 2^n ways per code point before deduplication: the work budget holds.
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(grammar_accepts(parse_gbnf("root ::= x{0,200} \"b\"\nx ::= \"a\"?"), "aab"));
  const Grammar n = parse_gbnf("root ::= x{0,200} \"b\"\nx ::= \"a\"? | \"c\"?");
  grammar_accepts(n, "acab");  // may be narrowed by the budget; must come back quickly
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
}

TEST(JsonSchema, ObjectsWithRequiredAndOptionalProperties) {
  const ojson schema = ojson::parse(R"({"type":"object","properties":{
      "name":{"type":"string"},"age":{"type":"integer","minimum":0},"tags":{"type":"array","items":{"enum":["a","b"]}},
      "kind":{"anyOf":[{"type":"null"},{"const":"x"}]}},
    "required":["name","age"],"additionalProperties":false})");
  const Grammar g = parse_gbnf(json_schema_to_gbnf(schema, "schema"));
  EXPECT_TRUE(grammar_accepts(g, R"({"name": "Bo", "age": 3})"));
  EXPECT_TRUE(grammar_accepts(g, R"({"name":"B\"o\u00e9","age":0,"tags":["a", "b"],"kind":null})"));
  EXPECT_TRUE(grammar_accepts(g, R"({"name": "x", "age": 12, "kind": "x"})"));
  EXPECT_FALSE(grammar_accepts(g, R"({"age": 3, "name": "Bo"})"));   // schema order
  EXPECT_FALSE(grammar_accepts(g, R"({"name": "Bo"})"));             // age is required
  EXPECT_FALSE(grammar_accepts(g, R"({"name": "Bo", "age": -3})"));  // minimum 0
  EXPECT_FALSE(grammar_accepts(g, R"({"name": "Bo", "age": 3, "tags": ["c"]})"));
  EXPECT_FALSE(grammar_accepts(g, R"({"name": "Bo", "age": 3, "extra": 1})"));
}

TEST(JsonSchema, RefsArraysFormatsAndLengths) {
  const ojson schema = ojson::parse(R"({"$defs":{"node":{"type":"object","properties":{
      "v":{"type":"number"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},"required":["v"]}},
    "type":"object","properties":{"tree":{"$ref":"#/$defs/node"},"when":{"type":"string","format":"date"},
      "code":{"type":"string","minLength":2,"maxLength":3},"pair":{"type":"array","prefixItems":[{"type":"boolean"},{"type":"null"}]}},
    "required":["tree","when","code","pair"]})");
  const Grammar g = parse_gbnf(json_schema_to_gbnf(schema, "s"));
  EXPECT_TRUE(grammar_accepts(
      g,
      R"({"tree": {"v": 1.5, "kids": [{"v": -2e3}, {"v": 0, "kids": []}]}, "when": "2024-02-29", "code": "ab", "pair": [true, null]})"));
  EXPECT_FALSE(grammar_accepts(
      g,
      R"({"tree": {"v": 1, "kids": [{"v": 1}, {"v": 2}, {"v": 3}]}, "when": "2024-02-29", "code": "ab", "pair": [true, null]})"));
  EXPECT_FALSE(grammar_accepts(g, R"({"tree": {"v": 1}, "when": "2024-13-01", "code": "ab", "pair": [true, null]})"));
  EXPECT_FALSE(grammar_accepts(g, R"({"tree": {"v": 1}, "when": "2024-12-01", "code": "abcd", "pair": [true, null]})"));
}

TEST(JsonSchema, UnsupportedKeywordsAreNamed) {
  auto err = [](const char* s) { return error_of([&] { json_schema_to_gbnf(ojson::parse(s), "response_format"); }); };
  EXPECT_NE(err(R"({"type":"string","pattern":"^a+$","maxLength":4})").find("\"pattern\" is not supported"),
            std::string::npos);
  EXPECT_NE(err(R"({"type":"object","properties":{"n":{"type":"number","multipleOf":3}}})")
                .find("response_format.properties.n: the JSON-schema keyword \"multipleOf\""),
            std::string::npos);
  // Integral bounds are enforced (number_range_test.cc); a fractional one on a number is not.
  EXPECT_NE(err(R"({"type":"number","minimum":0.5})").find("\"minimum\""), std::string::npos);
  EXPECT_NE(err(R"({"type":"string","format":"ipv6"})").find("format \"ipv6\""), std::string::npos);
  EXPECT_NE(err(R"({"$ref":"#/$defs/missing"})").find("points at nothing"), std::string::npos);
  // zod's z.int() bounds are the safe-integer range: no constraint beyond the grammar's.
  EXPECT_EQ(err(R"({"type":"integer","minimum":-9007199254740991,"maximum":9007199254740991})"), "");
}

TEST(JsonSchema, FormatsEmailHostnameIpv4Uri) {
  auto takes = [](const char* fmt, const std::string& value) {
    const Grammar g = parse_gbnf(json_schema_to_gbnf(ojson{{"type", "string"}, {"format", fmt}}, "s"));
    return grammar_accepts(g, ojson(value).dump());
  };
  for (const char* ok : {"ada@example.org", "a.b+tag@mail.co.uk", "x_1%y@a-b.io"})
    EXPECT_TRUE(takes("email", ok)) << ok;
  for (const char* bad : {"ada", "ada@", "@example.org", "ada@example", "a..b@x.org", "ada@-x.org", "a b@x.org"})
    EXPECT_FALSE(takes("email", bad)) << bad;
  for (const char* ok : {"localhost", "api.example.com", "a-1.b"}) EXPECT_TRUE(takes("hostname", ok)) << ok;
  for (const char* bad : {"-a.com", "a-.com", "a..b", "", "a_b.com"}) EXPECT_FALSE(takes("hostname", bad)) << bad;
  for (const char* ok : {"0.0.0.0", "192.168.1.255", "10.0.0.1"}) EXPECT_TRUE(takes("ipv4", ok)) << ok;
  for (const char* bad : {"256.1.1.1", "1.2.3", "01.2.3.4", "1.2.3.4.5", "1.2.3.-4"})
    EXPECT_FALSE(takes("ipv4", bad)) << bad;
  for (const char* ok :
       {"https://example.org/a?b=c#d", "mailto:ada@example.org", "urn:isbn:0451450523", "http://x/%20y"})
    EXPECT_TRUE(takes("uri", ok)) << ok;
  for (const char* bad : {"example.org", "http://a b", "1http://x", "http://x/%zz", "http://x/\"q"})
    EXPECT_FALSE(takes("uri", bad)) << bad;
}

TEST(GrammarConstraint, MaskOverRealVocabularyForcesValidJson) {
  const Tokenizer& tok = lathe::test::fixture_tokenizer("qwen3-real");
  auto trie = TokenTrie::of(tok);  // built once for both tests (about a second for 151k tokens)
  const ojson schema = ojson::parse(
      R"({"type":"object","properties":{"city":{"type":"string"},"n":{"type":"integer"}},"required":["city","n"]})");
  auto g = std::make_shared<const Grammar>(parse_gbnf(json_schema_to_gbnf(schema, "s")));
  const int32_t eos = *tok.token_to_id("<|im_end|>");
  auto c = std::make_shared<GrammarConstraint>(g, trie, ConstraintOptions{{eos}, {}, -1});

  // Logits that favour "PARIS" text and EOS (what an unconstrained model of upper-case replies would say):
  // the mask must still steer to JSON.
  const size_t vocab = tok.vocab_size();
  std::vector<float> logits(vocab, 0.0f);
  for (int32_t id : tok.encode("PARIS IS NICE")) logits[static_cast<size_t>(id)] = 5.0f;
  logits[static_cast<size_t>(eos)] = 9.0f;
  SamplingParams p;
  p.constraint = c;
  Sampler sampler(p, {eos});
  std::vector<int32_t> out;
  double mask_seconds = 0;
  for (int step = 0; step < 64; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    const SampleResult r = sampler.sample(logits, out);
    mask_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r.token == eos) break;
    out.push_back(r.token);
    // Nudge toward closing the string and giving a number once some text is there.
    if (out.size() == 6) logits[static_cast<size_t>(tok.encode("\"")[0])] = 20.0f;
  }
  const std::string text = tok.decode(out);
  ASSERT_FALSE(out.empty());
  EXPECT_TRUE(grammar_accepts(*g, text)) << text;
  const ojson parsed = ojson::parse(text);
  EXPECT_TRUE(parsed["city"].is_string());
  EXPECT_TRUE(parsed["n"].is_number_integer());
  RecordProperty("mean_sample_ms", std::to_string(mask_seconds * 1e3 / static_cast<double>(out.size() + 1)));
}

TEST(GrammarConstraint, EosOnlyWhenCompleteAndReasoningFirst) {
  const Tokenizer& tok = lathe::test::fixture_tokenizer("qwen3-real");
  auto trie = TokenTrie::of(tok);
  auto g = std::make_shared<const Grammar>(parse_gbnf(R"(root ::= "yes" | "no")"));
  const int32_t eos = *tok.token_to_id("<|im_end|>");
  const int32_t think_end = *tok.token_to_id("</think>");
  GrammarConstraint c(g, trie, ConstraintOptions{{eos}, {}, think_end});
  auto s = c.start();
  std::vector<float> logits(tok.vocab_size(), 0.0f);
  s->mask(logits);  // before </think>: unconstrained
  EXPECT_EQ(logits[static_cast<size_t>(eos)], 0.0f);
  for (int32_t id : tok.encode("hmm")) s->accept(id);
  s->accept(think_end);
  s->mask(logits);
  size_t allowed = 0;
  for (float v : logits) allowed += v == 0.0f;
  EXPECT_GE(allowed, 2u);
  EXPECT_EQ(logits[static_cast<size_t>(eos)], -std::numeric_limits<float>::infinity());
  const std::vector<int32_t> yes = tok.encode("yes");
  EXPECT_EQ(logits[static_cast<size_t>(yes[0])], 0.0f);
  for (int32_t id : yes) s->accept(id);
  std::vector<float> after(tok.vocab_size(), 0.0f);
  s->mask(after);
  for (size_t i = 0; i < after.size(); ++i) EXPECT_EQ(after[i] == 0.0f, static_cast<int32_t>(i) == eos) << i;
}

}  // namespace
}  // namespace lathe::grammar
