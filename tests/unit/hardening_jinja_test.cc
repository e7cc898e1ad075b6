// Templates that never end or grow without bound (issue #12) stop with a clear error within their budget; a
// template nested beyond the parser's depth is a syntax error, not a stack overflow.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>

#include "chat/chat_template.h"
#include "chat/jinja/template.h"
#include "common/error.h"
#include "jinja_test_util.h"

namespace lathe::jinja {
namespace {

using Clock = std::chrono::steady_clock;

// What rendering `source` throws ("" when it renders), and how long it took.
std::string render_error(const std::string& source, double* seconds = nullptr,
                         const RenderLimits& limits = default_render_limits()) {
  const auto t0 = Clock::now();
  std::string what;
  try {
    Template(source).render(ValueDict{}, limits);
  } catch (const Error& e) {
    what = e.what();
  }
  if (seconds) *seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return what;
}

TEST(HardeningJinja, NestedLoopsRunOutOfSteps) {
  double s = 0;
  const std::string e =
      render_error("{% for i in range(2**20) %}{% for j in range(2**20) %}{{ '' }}{% endfor %}{% endfor %}", &s);
  EXPECT_NE(e.find("render budget"), std::string::npos) << e;
  EXPECT_LT(s, 30.0);  // generous for sanitizer builds; the Release figure is in docs/security.md
}

TEST(HardeningJinja, HugeStringsAndListsAreRefusedBeforeTheyAreBuilt) {
  double s = 0;
  EXPECT_NE(render_error("{{ 'a' * 10**10 }}", &s).find("render budget"), std::string::npos);
  EXPECT_LT(s, 1.0);
  EXPECT_NE(render_error("{{ ([1] * 10**9) | length }}", &s).find("render budget"), std::string::npos);
  EXPECT_LT(s, 1.0);
  EXPECT_NE(render_error("{{ ('a' * 1000).replace('', 'x' * 100000) }}").find("render budget"), std::string::npos);
  // Doubling a string past the limit stops at the limit.
  EXPECT_NE(render_error("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
                         "{% endfor %}{{ ns.s | length }}")
                .find("render budget"),
            std::string::npos);
  // A huge exponent is not a huge loop.
  EXPECT_EQ(testing::render("{{ 1 ** (10**18) }}"), "1");
}

TEST(HardeningJinja, DeepNestingIsASyntaxError) {
  // 100k nested parentheses crashed the loader (SIGSEGV).
  const std::string deep = "{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}";
  std::string what;
  try {
    Template t(deep);
  } catch (const Error& e) {
    what = e.what();
  }
  EXPECT_NE(what.find("nested deeper than"), std::string::npos) << what;
  std::string blocks;
  for (int i = 0; i < 5000; ++i) blocks += "{% if true %}";
  for (int i = 0; i < 5000; ++i) blocks += "{% endif %}";
  EXPECT_THROW(Template{blocks}, Error);
  // Ordinary nesting still works.
  EXPECT_EQ(testing::render("{{ ((((1 + 2)))) }}"), "3");
}

TEST(HardeningJinja, CancellationStopsARender) {
  std::atomic<bool> cancel{true};
  RenderLimits l = default_render_limits();
  l.cancel = &cancel;
  const std::string e = render_error("{% for i in range(1000000) %}{{ i }}{% endfor %}", nullptr, l);
  EXPECT_NE(e.find("cancelled"), std::string::npos) << e;
}

TEST(HardeningJinja, ChatTemplateRenderHonoursCancellation) {
  ChatTemplate t("{% for i in range(1000000) %}{{ i }}{% endfor %}", nlohmann::ordered_json::object());
  std::atomic<bool> cancel{true};
  ChatTemplateInput in;
  in.cancel = &cancel;
  EXPECT_THROW(t.render(in), Error);
}

// A list or dict put inside itself (found by the fuzzer: repr recursed until the stack ran out) is refused at
// the mutation; a namespace holding itself is freed when the render ends. Nothing leaks, no walk is endless.
TEST(HardeningJinja, AContainerCannotContainItself) {
  for (const char* src : {"{% set l = [] %}{{ l.append(l) }}{{ l }}", "{% set l = [1] %}{{ l.insert(0, [l]) }}",
                          "{% set l = [] %}{{ l.extend([[1], l]) }}", "{% set d = {} %}{{ d.update(x={'y': d}) }}",
                          "{% set d = {} %}{{ d.setdefault('k', [d]) }}"}) {
    EXPECT_NE(render_error(src).find("inside itself"), std::string::npos) << src;
  }
  // A namespace may hold itself, as in Python (the render frees the cycle when it ends); walking it is an error.
  EXPECT_NE(render_error("{% set ns = namespace(a=1) %}{% set ns.b = [ns] %}{{ ns }}").find("contains itself"),
            std::string::npos);
  EXPECT_EQ(testing::render("{% set ns = namespace(a=1) %}{% set ns.b = {'up': ns} %}{{ ns.b.up.b.up.a }}"), "1");
  // The same value twice, or a copy, is not a cycle.
  EXPECT_EQ(testing::render("{% set a = [1] %}{% set l = [] %}{{ l.append(a) }}{{ l.append(a) }}{{ l }}"),
            "NoneNone[[1], [1]]");
  EXPECT_EQ(testing::render("{% set ns = namespace(l=[]) %}{% set ns.l = ns.l + [ns.l] %}{{ ns.l }}"), "[[]]");
}

// A value nested 200,000 lists deep is built within the step budget; printing, comparing or serialising it
// stops with an error, and dropping it does not overflow the stack.
TEST(HardeningJinja, DeeplyNestedValuesStopWithAnError) {
  const std::string build =
      "{% set ns = namespace(x=[]) %}{% for i in range(200000) %}{% set ns.x = [ns.x] %}{% endfor %}";
  for (const char* use : {"{{ ns.x }}", "{{ ns.x | tojson }}", "{{ ns.x == ns.x[0] }}", "{{ ns.x < ns.x[0] }}"}) {
    EXPECT_NE(render_error(build + use).find("nested deeper than"), std::string::npos) << use;
  }
  EXPECT_EQ(render_error(build + "{{ 'done' }}"), "");
  // Shared many times over (2^40 paths through 40 lists), a walk is bounded by the step budget.
  const std::string wide =
      "{% set ns = namespace(x=['abc'], y=['abc']) %}{% for i in range(40) %}{% set ns.x = [ns.x, ns.x] %}"
      "{% set ns.y = [ns.y, ns.y] %}{% endfor %}";
  double s = 0;
  EXPECT_NE(render_error(wide + "{{ ns.x }}", &s).find("render budget"), std::string::npos);
  EXPECT_LT(s, 30.0);
  const std::string e = render_error(wide + "{{ ns.x == ns.y }}");
  EXPECT_NE(e.find("render budget"), std::string::npos) << e;
}

// Numbers beyond int64 or double in a template (found by the fuzzer: std::stod threw out_of_range past every
// handler) are Python's inf / 0.0 or a clear error.
TEST(HardeningJinja, OutOfRangeNumbersAreValuesOrErrors) {
  EXPECT_EQ(testing::render("{{ 3e31646 }} {{ 1e-400 }}"), "inf 0.0");
  EXPECT_NE(render_error("{{ x.99999999999999999999 }}").find("out of range"), std::string::npos);
  EXPECT_NE(render_error("{{ '{99999999999999999999}'.format(1) }}").find("has no argument"), std::string::npos);
  EXPECT_EQ(
      testing::render("{{ [[1]] | map(attribute='0.99999999999999999999') | select('undefined') | list | length }}"),
      "1");
}

}  // namespace
}  // namespace lathe::jinja
