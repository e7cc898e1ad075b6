// Bad templates fail with the construct and line:col; runtime errors and raise_exception surface as lathe::Error.
#include <gtest/gtest.h>

#include "common/error.h"
#include "jinja_test_util.h"

namespace lathe::jinja {
namespace {

using testing::render;

// The message of the error `fn` throws, or "" when it does not throw lathe::Error.
template <typename Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string syntax_error(const std::string& source) {
  return error_of([&] { Template t(source); });
}

TEST(JinjaErrors, SyntaxErrorsNameConstructAndPosition) {
  std::string e = syntax_error("ok\n{% if x %}never closed");
  EXPECT_NE(e.find("2:4"), std::string::npos) << e;
  EXPECT_NE(e.find("'if'"), std::string::npos) << e;
  e = syntax_error("{{ 1 + }}");
  EXPECT_NE(e.find("1:8"), std::string::npos) << e;
  EXPECT_NE(e.find("expected an expression"), std::string::npos) << e;
  e = syntax_error("{% for x in y %}{% endif %}");
  EXPECT_NE(e.find("1:20"), std::string::npos) << e;
  EXPECT_NE(e.find("'endif'"), std::string::npos) << e;
  e = syntax_error("a\nb {{ x | nosuch }}");
  EXPECT_NE(e.find("2:10"), std::string::npos) << e;
  EXPECT_NE(e.find("no filter named 'nosuch'"), std::string::npos) << e;
  e = syntax_error("line1\n  {{ 'abc }}");
  EXPECT_NE(e.find("2:6"), std::string::npos) << e;
  EXPECT_NE(e.find("unterminated string"), std::string::npos) << e;
  e = syntax_error("{{ x is nosuchtest }}");
  EXPECT_NE(e.find("no test named 'nosuchtest'"), std::string::npos) << e;
  e = syntax_error("{# open comment");
  EXPECT_NE(e.find("unterminated comment"), std::string::npos) << e;
  e = syntax_error("{% bogus %}");
  EXPECT_NE(e.find("'bogus'"), std::string::npos) << e;
  e = syntax_error("{{ x ");
  EXPECT_NE(e.find("'}}'"), std::string::npos) << e;
}

TEST(JinjaErrors, RuntimeErrorsCarryPosition) {
  std::string e = error_of([] { render("ok\n{% for m in none %}{% endfor %}"); });
  EXPECT_NE(e.find("'NoneType' object is not iterable"), std::string::npos) << e;
  EXPECT_NE(e.find("2:4"), std::string::npos) << e;
  e = error_of([] { render("{{ missing.attr }}"); });
  EXPECT_NE(e.find("'missing' is undefined"), std::string::npos) << e;
  e = error_of([] { render("{{ 'a' + 1 }}"); });
  EXPECT_NE(e.find("can only concatenate str"), std::string::npos) << e;
  e = error_of([] { render("{% set x = 1 %}{% set x.y = 2 %}"); });
  EXPECT_NE(e.find("non-namespace"), std::string::npos) << e;
  e = error_of([] { render("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"); });
  EXPECT_NE(e.find("recursion"), std::string::npos) << e;
}

}  // namespace
}  // namespace lathe::jinja
