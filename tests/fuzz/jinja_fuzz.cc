// Jinja templates: parse, then render a small conversation within a reduced budget (so one input stays fast).
#include "chat/jinja/template.h"
#include "common/error.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lathe::jinja;
  static const ValueDict vars = [] {
    ValueDict d;
    d.set("messages", from_json(nlohmann::ordered_json::parse(
                          R"([{"role":"system","content":"be brief"},{"role":"user","content":"hi"},)"
                          R"({"role":"assistant","content":"hello","tool_calls":[{"function":{"name":"f",)"
                          R"("arguments":{"a":1}}}]}])")));
    d.set("add_generation_prompt", Value(true));
    d.set("bos_token", Value("<s>"));
    return d;
  }();
  RenderLimits limits = default_render_limits();
  limits.max_steps = 200000;
  limits.max_string_bytes = 1 << 20;
  limits.max_list_items = 1 << 16;
  LATHE_FUZZ_EXPECTED_ERRORS({
    const Template t(lathe::fuzz::text(data, size));
    (void)t.render(vars, limits);
  });
  return 0;
}
