// Model output → tool calls (both markups) and the streaming gate; the output is attacker-steerable text.
#include "chat/tool_calls.h"
#include "common/error.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::json tools =
      nlohmann::json::parse(R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",)"
                            R"("properties":{"city":{"type":"string"},"days":{"type":"integer"}}}}}])");
  const std::string text = lathe::fuzz::text(data, size);
  LATHE_FUZZ_EXPECTED_ERRORS({
    (void)lathe::parse_tool_calls(text, tools);
    lathe::ToolMarkupGate gate;
    for (size_t i = 0; i < text.size(); i += 7) (void)gate.push(std::string_view(text).substr(i, 7));
    (void)gate.flush();
  });
  return 0;
}
