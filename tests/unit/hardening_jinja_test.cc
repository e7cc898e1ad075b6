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

}  // namespace
}  // namespace lathe::jinja
