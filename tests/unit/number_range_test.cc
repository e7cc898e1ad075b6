// Numeric bounds of a JSON schema as grammar: over every bound pair near zero and at the 16-digit edge, a
// spelling is accepted exactly when it is a plain decimal (no leading zeros, no exponent) whose value lies within
// the bounds; and the schema keywords reach it (pydantic's ge/le/gt/lt, zod's int().positive(), draft 4).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "chat/grammar/gbnf.h"
#include "chat/grammar/grammar_matcher.h"
#include "chat/grammar/json_schema.h"
#include "chat/grammar/number_range.h"
#include "common/error.h"

namespace lathe::grammar {
namespace {

using ojson = nlohmann::ordered_json;

bool accepts(const std::string& expr, const std::string& text) {
  return grammar_accepts(parse_gbnf("root ::= " + expr + "\n"), text);
}

// Plain decimal spellings around [-25, 25]: integers, and fractions a grammar must place on the right side of a
// bound (x.5, x.05, x.0, x.00), with spellings that are never right (leading zeros, "-0", a bare ".").
std::vector<std::string> spellings() {
  std::vector<std::string> out;
  for (int v = -25; v <= 25; ++v) {
    const std::string i = std::to_string(v);
    for (const char* f : {"", ".5", ".05", ".0", ".00", ".9"}) out.push_back(i + f);
  }
  for (const char* s : {"-0", "-0.5", "-0.0", "00", "01", "-01", "1.", ".5", "1e1", "+1", "-"}) out.push_back(s);
  return out;
}

bool plain_decimal(const std::string& s) {
  size_t i = s[0] == '-' ? 1 : 0;
  if (i >= s.size() || !std::isdigit(static_cast<unsigned char>(s[i]))) return false;
  if (s[i] == '0' && i + 1 < s.size() && std::isdigit(static_cast<unsigned char>(s[i + 1]))) return false;
  const size_t dot = s.find('.');
  if (dot != std::string::npos && dot + 1 == s.size()) return false;
  for (size_t k = i; k < s.size(); ++k)
    if (!std::isdigit(static_cast<unsigned char>(s[k])) && k != dot) return false;
  return true;
}

TEST(NumberRange, AcceptsExactlyTheValuesWithinEveryBoundPair) {
  size_t checked = 0;
  const std::vector<std::string> texts = spellings();
  for (bool integer : {true, false})
    for (int lo = -12; lo <= 12; lo += 3)
      for (int hi = lo; hi <= 13; hi += 5)
        for (int shape = 0; shape < 8; ++shape) {
          NumberBounds b;
          if (shape & 1) b.lo = lo;
          if (shape & 2) b.hi = hi;
          b.lo_open = b.lo && (shape & 4);
          b.hi_open = b.hi && (shape & 4) && (hi % 2 == 0);
          std::string expr;
          try {
            expr = number_range_gbnf(b, integer);
          } catch (const Error&) {
            EXPECT_TRUE(b.lo && b.hi && (*b.lo == *b.hi) && (b.lo_open || b.hi_open)) << lo << ".." << hi;
            continue;
          }
          const Grammar g = parse_gbnf("root ::= " + expr + "\n");
          for (const std::string& t : texts) {
            const double v = std::atof(t.c_str());
            bool in = plain_decimal(t) && (!integer || t.find('.') == std::string::npos) && t != "-0" &&
                      !(t.rfind("-0", 0) == 0 && v == 0.0);  // a negative zero is never written
            if (b.lo) in = in && (b.lo_open ? v > *b.lo : v >= *b.lo);
            if (b.hi) in = in && (b.hi_open ? v < *b.hi : v <= *b.hi);
            ASSERT_EQ(grammar_accepts(g, t), in)
                << (integer ? "integer " : "number ") << (b.lo_open ? "(" : "[")
                << (b.lo ? std::to_string(*b.lo) : "-inf") << ", " << (b.hi ? std::to_string(*b.hi) : "inf")
                << (b.hi_open ? ")" : "]") << " on \"" << t << "\": " << expr;
            ++checked;
          }
        }
  EXPECT_GT(checked, 10000u);
}

TEST(NumberRange, WideRangesSplitByDigitCount) {
  std::mt19937_64 rng(7);
  const uint64_t lo = 4503599627370496ULL, hi = 9007199254740991ULL;  // 2^52 .. 2^53 - 1
  const std::string expr = uint_range_gbnf(lo, hi);
  const Grammar g = parse_gbnf("root ::= " + expr + "\n");
  for (int i = 0; i < 300; ++i) {
    const uint64_t v = rng() % 10000000000000000ULL;
    EXPECT_EQ(grammar_accepts(g, std::to_string(v)), v >= lo && v <= hi) << v;
  }
  for (uint64_t v : {lo - 1, lo, lo + 1, hi - 1, hi, hi + 1})
    EXPECT_EQ(grammar_accepts(g, std::to_string(v)), v >= lo && v <= hi) << v;
  EXPECT_TRUE(accepts(uint_range_gbnf(0, 0), "0"));
  EXPECT_FALSE(accepts(uint_range_gbnf(0, 0), "00"));
  EXPECT_TRUE(accepts(uint_range_gbnf(7, 1234), "999"));
  EXPECT_FALSE(accepts(uint_range_gbnf(7, 1234), "1235"));
  EXPECT_FALSE(accepts(uint_range_gbnf(7, 1234), "6"));
}

TEST(NumberRange, SchemaKeywordsBecomeBounds) {
  auto gbnf = [](const char* schema) { return json_schema_to_gbnf(ojson::parse(schema), "s"); };
  auto ok = [&](const char* schema, const char* text) { return grammar_accepts(parse_gbnf(gbnf(schema)), text); };
  // pydantic conint(ge=1, le=10)
  EXPECT_TRUE(ok(R"({"type":"integer","minimum":1,"maximum":10})", "10"));
  EXPECT_FALSE(ok(R"({"type":"integer","minimum":1,"maximum":10})", "0"));
  EXPECT_FALSE(ok(R"({"type":"integer","minimum":1,"maximum":10})", "11"));
  // zod: z.number().int().positive() (exclusiveMinimum 0, the safe-integer maximum: no upper bound)
  EXPECT_FALSE(ok(R"({"type":"integer","exclusiveMinimum":0,"maximum":9007199254740991})", "0"));
  EXPECT_TRUE(ok(R"({"type":"integer","exclusiveMinimum":0,"maximum":9007199254740991})", "123456"));
  // pydantic confloat(ge=0, le=1): a probability
  EXPECT_TRUE(ok(R"({"type":"number","minimum":0,"maximum":1})", "0.25"));
  EXPECT_TRUE(ok(R"({"type":"number","minimum":0,"maximum":1})", "1.0"));
  EXPECT_FALSE(ok(R"({"type":"number","minimum":0,"maximum":1})", "1.5"));
  EXPECT_FALSE(ok(R"({"type":"number","minimum":0,"maximum":1})", "-0.5"));
  // gt=0 on a number: any positive value, 0.001 included
  EXPECT_TRUE(ok(R"({"type":"number","exclusiveMinimum":0})", "0.001"));
  EXPECT_FALSE(ok(R"({"type":"number","exclusiveMinimum":0})", "0.000"));
  // draft 4: a boolean exclusiveMaximum beside maximum
  EXPECT_FALSE(ok(R"({"type":"integer","maximum":5,"exclusiveMaximum":true})", "5"));
  EXPECT_TRUE(ok(R"({"type":"integer","maximum":5,"exclusiveMaximum":true})", "4"));
  // A fractional bound on an integer rounds inward; the tighter of two lower bounds wins.
  EXPECT_FALSE(ok(R"({"type":"integer","minimum":2.5})", "2"));
  EXPECT_TRUE(ok(R"({"type":"integer","minimum":2.5})", "3"));
  EXPECT_FALSE(ok(R"({"type":"integer","minimum":1,"exclusiveMinimum":4})", "4"));
  // Refused with the keyword named: a fractional bound on a number, bounds past 16 digits, an empty range.
  auto err = [&](const char* schema) {
    try {
      gbnf(schema);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(err(R"({"type":"number","maximum":0.5})").find("\"maximum\" is not supported"), std::string::npos);
  EXPECT_NE(err(R"({"type":"integer","minimum":1e17})").find("\"minimum\" is not supported"), std::string::npos);
  EXPECT_NE(err(R"({"type":"integer","minimum":5,"maximum":4})").find("no integer lies within"), std::string::npos);
}

}  // namespace
}  // namespace lathe::grammar
