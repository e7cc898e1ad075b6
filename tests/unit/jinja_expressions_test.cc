// Jinja expressions with Python semantics: operators, literals, slicing, membership and methods.
#include <gtest/gtest.h>

#include "jinja_test_util.h"

namespace lathe::jinja {
namespace {

using json = nlohmann::ordered_json;
using testing::render;

TEST(JinjaExpressions, Arithmetic) {
  EXPECT_EQ(render("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1 + 2.5 }}"),
            "3 -4 1 2 3.5 1024 3.5");
  EXPECT_EQ(render("{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ -2 ** 2 }} {{ 10 - 2 - 3 }}"), "7 9 4 5");
  EXPECT_EQ(render("{{ 'ab' * 2 }} {{ [1] + [2] }} {{ 'a' + 'b' }}"), "abab [1, 2] ab");
  EXPECT_EQ(render("{{ 0.1 + 0.2 }} {{ 1e-05 }} {{ 3.0 }} {{ 1e16 }}"), "0.30000000000000004 1e-05 3.0 1e+16");
}

TEST(JinjaExpressions, LogicComparisonAndConcat) {
  EXPECT_EQ(render("{{ 'a' ~ 1 ~ none }}"), "a1None");
  EXPECT_EQ(render("{{ 'y' if x else 'n' }}{{ 'y' if not x else 'n' }}", {{"x", true}}), "yn");
  EXPECT_EQ(render("[{{ 'y' if false }}]"), "[]");
  EXPECT_EQ(render("{{ 0 or 'b' }} {{ 1 and 'c' }} {{ none or [] }}"), "b c []");
  EXPECT_EQ(render("{{ 1 == 1.0 }} {{ 'a' < 'b' }} {{ 2 >= 3 }} {{ [1, 2] == [1, 2] }} {{ true == 1 }}"),
            "True True False True True");
  EXPECT_EQ(render("{{ not 1 == 2 }} {{ not (true and false) }}"), "True True");
}

TEST(JinjaExpressions, MembershipAndLiterals) {
  EXPECT_EQ(render("{{ 'a' in 'cat' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }} {{ 'x' in ('x',) }}"),
            "True True True True True");
  EXPECT_EQ(render("{{ [1, 'a', none, true, 1.5, {'k': 'v'}] }}"), "[1, 'a', None, True, 1.5, {'k': 'v'}]");
  EXPECT_EQ(render("{{ [\"it's\"] }} {{ 'a\\nb' | length }} {{ \"\\u00e9\" }}"), "[\"it's\"] 3 é");
  EXPECT_EQ(render("{{ 'abc' 'def' }}"), "abcdef");
}

TEST(JinjaExpressions, IndexingAndSlicing) {
  EXPECT_EQ(render("{{ 'hello'[::-1] }} {{ [1, 2, 3, 4][1:3] }} {{ 'hello'[-3:] }} {{ [1, 2, 3][-1] }}"),
            "olleh [2, 3] llo 3");
  EXPECT_EQ(render("{{ 'héllo'[1] }} {{ 'héllo'[:2] }} {{ [1, 2, 3, 4, 5][::2] }}"), "é hé [1, 3, 5]");
  EXPECT_EQ(render("{{ m.role }} {{ m['content'] }} {{ ms[0].role }}",
                   {{"m", {{"role", "user"}, {"content", "hi"}}}, {"ms", json::array({{{"role", "x"}}})}}),
            "user hi x");
  EXPECT_EQ(render("{{ items[5] is defined }}", {{"items", {1}}}), "False");
}

TEST(JinjaExpressions, StringMethods) {
  EXPECT_EQ(render("{{ '  x y  '.strip() }}|{{ 'a,b,,c'.split(',') }}|{{ 'a b  c'.split() }}|"
                   "{{ 'Hello'.startswith('He') }}|{{ 'x.py'.endswith(('.py', '.js')) }}"),
            "x y|['a', 'b', '', 'c']|['a', 'b', 'c']|True|True");
  EXPECT_EQ(render("{{ 'ab'.upper() }}|{{ 'AB'.lower() }}|{{ 'hello world'.title() }}|{{ 'aaa'.replace('a', 'b', 2) }}|"
                   "{{ '--x--'.lstrip('-') }}|{{ '--x--'.rstrip('-') }}|{{ 'a<b>c'.split('<')[1].split('>')[0] }}"),
            "AB|ab|Hello World|bba|x--|--x|b");
  EXPECT_EQ(render("{{ '{} and {}'.format(1, 'b') }}|{{ 'x'.join(['1', '2']) }}|{{ 'abcb'.count('b') }}"),
            "1 and b|1x2|2");
}

TEST(JinjaExpressions, DictAndListMethods) {
  const json vars = {{"d", {{"a", 1}, {"b", 2}}}};
  EXPECT_EQ(render("{{ d.get('a') }} {{ d.get('z', 'dflt') }} {{ d.get('z') }} {{ d.keys() | list }} "
                   "{{ d.values() | list }}",
                   vars),
            "1 dflt None ['a', 'b'] [1, 2]");
  EXPECT_EQ(render("{% set ns = namespace(q=[]) %}{% set _ = ns.q.append(1) %}{% set _ = ns.q.append(2) %}"
                   "{{ ns.q.pop(0) }}{{ ns.q }}"),
            "1[2]");
}

}  // namespace
}  // namespace lathe::jinja
