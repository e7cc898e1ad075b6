// Jinja filters and tests as chat templates use them.
#include <gtest/gtest.h>

#include "jinja_test_util.h"

namespace lathe::jinja {
namespace {

using json = nlohmann::ordered_json;
using testing::render;

TEST(JinjaFilters, TojsonKeepsKeyOrderAndUnicode) {
  const json d = json::parse(R"({"b": [1, 2.5, "é\n\"q\""], "a": null, "t": true})");
  EXPECT_EQ(render("{{ d | tojson }}", {{"d", d}}), R"({"b": [1, 2.5, "é\n\"q\""], "a": null, "t": true})");
  EXPECT_EQ(render("{{ d | tojson(indent=2) }}", {{"d", json::parse(R"({"a": [1, 2], "b": {}})")}}),
            "{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": {}\n}");
  EXPECT_EQ(render("{{ d | tojson(sort_keys=true) }}", {{"d", json::parse(R"({"b": 1, "a": {"d": 1, "c": 2}})")}}),
            R"({"a": {"c": 2, "d": 1}, "b": 1})");
  EXPECT_EQ(render("{{ '<tag>' | tojson }}"), "\"<tag>\"");
}

TEST(JinjaFilters, StringFilters) {
  EXPECT_EQ(render("[{{ '  a b \n' | trim }}]|{{ 'héllo' | length }}|{{ 42 | string }}|{{ 'hELLO' | capitalize }}"),
            "[a b]|5|42|Hello");
  EXPECT_EQ(render("{{ 'ab' | upper }}{{ 'AB' | lower }}|{{ 'a-a' | replace('-', '+') }}|{{ 'big cat' | title }}"),
            "ABab|a+a|Big Cat");
  EXPECT_EQ(render("{{ 'a\nb\n\nc' | indent(2) }}|{{ 'a\nb' | indent(2, true) }}"), "a\n  b\n\n  c|  a\n  b");
  EXPECT_EQ(render("{{ \"<a href='x'>&\\\"\" | e }}"), "&lt;a href=&#39;x&#39;&gt;&amp;&#34;");
  EXPECT_EQ(render("{{ '<b>' | safe }}"), "<b>");
}

TEST(JinjaFilters, SequenceFilters) {
  const json msgs = json::parse(R"([{"role": "system", "name": "s"}, {"role": "user", "name": "u1"},
                                    {"role": "user", "name": "u2", "x": 1}])");
  EXPECT_EQ(render("{{ msgs | selectattr('role', 'equalto', 'user') | map(attribute='name') | join(',') }}",
                   {{"msgs", msgs}}),
            "u1,u2");
  EXPECT_EQ(render("{{ msgs | rejectattr('x') | list | length }}", {{"msgs", msgs}}), "2");
  EXPECT_EQ(render("{{ msgs | map(attribute='name') | map('upper') | join }}", {{"msgs", msgs}}), "SU1U2");
  EXPECT_EQ(render("{{ [1, 2, 3, 4] | select('odd') | list }} {{ [1, 2, 3] | reject('equalto', 2) | list }}"),
            "[1, 3] [1, 3]");
  EXPECT_EQ(render("{{ [3, 1, 2] | first }}{{ [3, 1, 2] | last }}{{ [3, 1, 2] | min }}{{ [3, 1, 2] | max }}"), "3213");
  EXPECT_EQ(render("{{ ['B', 'a'] | min }} {{ [1, 2, 1, 3] | unique | list }} {{ [3, 1, 2] | sort }} "
                   "{{ [1, 2] | reverse | list }} {{ [1, 2, 3] | sum }}"),
            "a [1, 2, 3] [1, 2, 3] [2, 1] 6");
  EXPECT_EQ(render("{{ 'ab' | list }} {{ {'k': 1} | items | list | length }}"), "['a', 'b'] 1");
  EXPECT_EQ(render("{% for k, v in d | dictsort %}{{ k }}{{ v }}{% endfor %}", {{"d", {{"b", 1}, {"A", 2}}}}), "A2b1");
}

TEST(JinjaFilters, NumbersAndDefaults) {
  EXPECT_EQ(render("{{ '42' | int }} {{ '4.7' | int }} {{ 'x' | int }} {{ '2.5' | float }} {{ -3 | abs }}"),
            "42 4 0 2.5 3");
  EXPECT_EQ(render("{{ 3.14159 | round(2) }} {{ 2.5 | round }} {{ 2.1 | round(method='ceil') }}"), "3.14 2.0 3.0");
  EXPECT_EQ(render("{{ missing | default('d') }} {{ none | default('d') }} {{ '' | default('d', true) }}"), "d None d");
}

TEST(JinjaTests, TypeAndValueTests) {
  const json vars = {{"s", "x"}, {"d", json::object()}, {"l", json::array()}, {"n", nullptr}, {"b", false}, {"i", 3},
                     {"f", 1.5}};
  EXPECT_EQ(render("{{ s is string }}{{ d is mapping }}{{ l is sequence }}{{ s is sequence }}{{ n is none }}"
                   "{{ b is boolean }}{{ b is false }}{{ b is true }}{{ i is number }}{{ f is number }}",
                   vars),
            "TrueTrueTrueTrueTrueTrueTrueFalseTrueTrue");
  EXPECT_EQ(render("{{ i is integer }}{{ f is float }}{{ s is iterable }}{{ i is iterable }}{{ d is not mapping }}"
                   "{{ missing is defined }}{{ missing is undefined }}{{ l is not string }}",
                   vars),
            "TrueTrueTrueFalseFalseFalseTrueTrue");
  EXPECT_EQ(render("{{ i is odd }}{{ i is even }}{{ i is divisibleby 3 }}{{ i is equalto 3 }}{{ 'a' is in 'cat' }}"
                   "{{ i is gt(2) }}{{ i is sameas 3 }}",
                   vars),
            "TrueFalseTrueTrueTrueTrueTrue");
}

}  // namespace
}  // namespace lathe::jinja
