// A JSON schema's "pattern" as grammar, checked against std::regex (ECMAScript, the dialect JSON Schema names):
// over every string of up to four characters from an alphabet with letters, digits, a space, a dash, a dot, a
// quote, a backslash and a newline, the grammar takes a string's JSON text exactly when regex_search matches
// it (unanchored unless ^/$ say so). What a grammar cannot say is refused with the construct named.
#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/grammar/gbnf.h"
#include "chat/grammar/grammar_matcher.h"
#include "chat/grammar/json_schema.h"
#include "chat/grammar/regex_pattern.h"
#include "common/error.h"

namespace lathe::grammar {
namespace {

using ojson = nlohmann::ordered_json;

Grammar schema_grammar(const std::string& pattern) {
  return parse_gbnf(json_schema_to_gbnf(ojson{{"type", "string"}, {"pattern", pattern}}, "s"));
}

std::vector<std::string> strings_up_to(size_t n) {
  const std::string alphabet = "ab1- .\"\\\n";
  std::vector<std::string> out = {""};
  for (size_t len = 1, from = 0; len <= n; ++len) {
    const size_t to = out.size();
    for (size_t i = from; i < to; ++i)
      for (char c : alphabet) out.push_back(out[i] + c);
    from = to;
  }
  return out;
}

TEST(RegexPattern, MatchesWhatEcmaScriptRegexSearchMatches) {
  const std::vector<std::string> patterns = {
      "^[a-z]+$",      "^\\d{2,3}$", "a",          "^a|b$",    "^(ab|1)*$",      "^[^a]$",
      "^.$",           "^\\w+-\\d$", "^[\\s\"]+$", "^\\\\$",   "^\"$",           "^(?:a|)b$",
      "^a{2}$",        "^a{1,}$",    "^[a-]$",     "^[-a]$",   "^\\.?$",         "^([ab]+) 1$",
      "b1$",           "^\\D\\W$",   "^[\\d.]+$",  "^a+?b*?$", "^\\x61\\u0062$", "^[^\\s]*$",
      "^(a|b)(1|-)?$", "\\n",        "^[a\\-1]$",  "^\\S+$",   "^(a{1,2}){2}$",  "^[\\\\\"]$",
      "^(a*)?(1|b?)$", "^(a?b)+$"};
  const std::vector<std::string> texts = strings_up_to(4);
  size_t checked = 0;
  for (const std::string& p : patterns) {
    const Grammar g = schema_grammar(p);
    const std::regex re(p, std::regex::ECMAScript);
    for (const std::string& t : texts) {
      const bool want = std::regex_search(t, re);
      ASSERT_EQ(grammar_accepts(g, ojson(t).dump()), want)
          << "pattern " << p << " on " << ojson(t).dump() << " (grammar: " << pattern_gbnf(p) << ")";
      ++checked;
    }
  }
  EXPECT_GT(checked, 100000u);
}

TEST(RegexPattern, WhatAGrammarCannotSayIsRefusedByName) {
  auto err = [](const std::string& p) {
    try {
      pattern_gbnf(p);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(err("^(?=a)a$").find("lookaround"), std::string::npos);
  EXPECT_NE(err("^(?!a).$").find("lookaround"), std::string::npos);
  EXPECT_NE(err("\\bword\\b").find("word boundary"), std::string::npos);
  EXPECT_NE(err("^(a)\\1$").find("backreference"), std::string::npos);
  EXPECT_NE(err("^a$b").find("'^' or '$' inside"), std::string::npos);
  EXPECT_NE(err("^\\p{L}+$").find("\\p"), std::string::npos);
  EXPECT_NE(err("^a{1001}$").find("above 1000"), std::string::npos);
  EXPECT_NE(err("^(a").find("unterminated group"), std::string::npos);
  EXPECT_NE(err("^[a$").find("unterminated character class"), std::string::npos);
  EXPECT_NE(err("*a").find("nothing to repeat"), std::string::npos);
  // A repeated group that can match nothing would recurse without reading: named, where a* alone is fine.
  EXPECT_NE(err("^(a*)*$").find("can match nothing"), std::string::npos);
  EXPECT_NE(err("^(a|b?)+$").find("can match nothing"), std::string::npos);
  EXPECT_NE(err("^(a?b?){2,3}$").find("can match nothing"), std::string::npos);
  EXPECT_EQ(err("^(a*)?(a|b?)$"), "");
  EXPECT_EQ(err("^(a*b)*$"), "");
  // Through the schema: the error names the field, and pattern beside a length or format is refused.
  auto schema_err = [](const ojson& s) {
    try {
      json_schema_to_gbnf(s, "response_format");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(schema_err({{"type", "string"}, {"pattern", "(?=x)"}}).find("response_format.pattern: pattern: lookaround"),
            std::string::npos);
  EXPECT_NE(schema_err({{"type", "string"}, {"pattern", "^a$"}, {"maxLength", 3}}).find("\"pattern\" is not supported"),
            std::string::npos);
  // A named group is a group (std::regex has no names: compared with the unnamed one's grammar).
  EXPECT_EQ(pattern_gbnf("^(?<w>[ab]+) 1$"), pattern_gbnf("^([ab]+) 1$"));
  // A pattern with no type is a string's.
  EXPECT_TRUE(
      grammar_accepts(parse_gbnf(json_schema_to_gbnf({{"pattern", "^[0-9]{3}-[0-9]{4}$"}}, "s")), "\"555-1234\""));
}

}  // namespace
}  // namespace lathe::grammar
