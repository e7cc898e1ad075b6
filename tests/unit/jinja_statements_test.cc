// Jinja statements: if/for/set/macro/call, loop variables, scoping and whitespace control.
#include <gtest/gtest.h>

#include "jinja_test_util.h"

namespace lathe::jinja {
namespace {

using json = nlohmann::ordered_json;
using testing::render;

TEST(JinjaStatements, IfElifElse) {
  const std::string t = "{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %}";
  EXPECT_EQ(render(t, {{"x", 1}}), "one");
  EXPECT_EQ(render(t, {{"x", 2}}), "two");
  EXPECT_EQ(render(t, {{"x", 7}}), "many");
}

TEST(JinjaStatements, LoopVariables) {
  EXPECT_EQ(render("{% for i in items %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}"
                   "{{ loop.length }}{{ loop.revindex }}|{% endfor %}",
                   {{"items", {"a", "b"}}}),
            "10TrueFalse22|21FalseTrue21|");
  EXPECT_EQ(render("{% for i in [1, 2, 3] %}{{ loop.previtem is defined }}{{ loop.nextitem | default('-') }} "
                   "{% endfor %}"),
            "False2 True3 True- ");
  EXPECT_EQ(render("{% for i in range(4) %}{{ loop.cycle('a', 'b') }}{% endfor %}"), "abab");
}

TEST(JinjaStatements, ForElseFilterUnpackAndLoopControls) {
  EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for x in [1, 2, 3, 4] if x is even %}{{ x }}/{{ loop.length }} {% endfor %}"), "2/2 4/2 ");
  EXPECT_EQ(render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {{"d", {{"b", 1}, {"a", 2}}}}),
            "b=1;a=2;");
  EXPECT_EQ(render("{% for k in d %}{{ k }}{% endfor %}", {{"d", {{"z", 1}, {"y", 2}}}}), "zy");
  EXPECT_EQ(render("{% for x in range(10) %}{% if x == 4 %}{% break %}{% endif %}"
                   "{% if x == 1 %}{% continue %}{% endif %}{{ x }}{% endfor %}"),
            "023");
}

TEST(JinjaStatements, SetScopingAndNamespace) {
  // A loop body has its own scope: plain `set` does not leak out, namespace attributes do.
  EXPECT_EQ(render("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}"), "21");
  EXPECT_EQ(render("{% set ns = namespace(x=1) %}{% for i in [1, 2] %}{% set ns.x = ns.x + i %}{% endfor %}"
                   "{{ ns.x }}"),
            "4");
  // `if` does not open a scope.
  EXPECT_EQ(render("{% if true %}{% set y = 'in' %}{% endif %}{{ y }}"), "in");
  EXPECT_EQ(render("{% set s %}a{{ 1 + 1 }}b{% endset %}[{{ s }}]"), "[a2b]");
  EXPECT_EQ(render("{% set a, b = [1, 2] %}{{ b }}{{ a }}"), "21");
}

TEST(JinjaStatements, MacrosWithDefaultsKeywordsRecursionAndCall) {
  EXPECT_EQ(render("{% macro m(a, b='B', c=none) %}{{ a }}{{ b }}{{ c }}{% endmacro %}"
                   "{{ m(1) }}|{{ m(1, c=3) }}|{{ m(1, 2, 3) }}"),
            "1BNone|1B3|123");
  EXPECT_EQ(render("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}"), "321");
  EXPECT_EQ(render("{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}"
                   "{% call wrap('b') %}hi{% endcall %}"),
            "<b>hi</b>");
  // A macro's result is a string that expressions can use.
  EXPECT_EQ(render("{% macro t() %}abc{% endmacro %}{{ t() | length }}{{ t() == 'abc' }}"), "3True");
  EXPECT_EQ(render("{% filter upper %}shout {{ 'this' }}{% endfilter %}"), "SHOUT THIS");
  EXPECT_EQ(render("{% generation %}kept{% endgeneration %}"), "kept");
}

TEST(JinjaStatements, WhitespaceControl) {
  // trim_blocks + lstrip_blocks, as transformers configures Jinja.
  EXPECT_EQ(render("  {% if true %}\nyes\n  {% endif %}\nafter"), "yes\nafter");
  EXPECT_EQ(render("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(render("a {{- 'x' -}} b"), "axb");
  EXPECT_EQ(render("  {%+ if true %}x{% endif %}"), "  x");
  EXPECT_EQ(render("a {# note #} b"), "a  b");
  EXPECT_EQ(render("a\n  {# note #}\nb"), "a\nb");
  EXPECT_EQ(render("{{ 'v' }}\n{{ 'w' }}"), "v\nw");  // variable tags keep their newline
  EXPECT_EQ(render("{% if true +%}\nkeep{% endif %}"), "\nkeep");
  EXPECT_EQ(render("x\n"), "x");  // one trailing newline is dropped
  EXPECT_EQ(render("x\r\ny"), "x\ny");
}

TEST(JinjaStatements, UndefinedIsEmptyAndFalsy) {
  EXPECT_EQ(render("[{{ missing }}]{% if missing %}t{% else %}f{% endif %}{% for x in missing %}x{% endfor %}"), "[]f");
  EXPECT_EQ(render("{{ d.nope is defined }}{{ d['nope'] is undefined }}", {{"d", json::object()}}), "FalseTrue");
}

}  // namespace
}  // namespace lathe::jinja
