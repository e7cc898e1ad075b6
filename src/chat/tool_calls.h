// Tool calls in model output, for the ChatML/Qwen families: `<tool_call>{"name":…,"arguments":…}</tool_call>`
// and `<tool_call><function=NAME><parameter=K>V</parameter></function></tool_call>`. Parsing happens once the
// generation ends; while streaming, ToolMarkupGate lets content through until the first tool marker.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace lathe {

struct ToolCall {
  std::string id;  // "call_" + 8 hex digits
  std::string name;
  std::string arguments;  // always a JSON object serialised as a string
};

struct ParsedOutput {
  std::string content;          // with calls: the text outside the markup, trimmed; without: the text unchanged
  std::vector<ToolCall> calls;  // empty when there was no markup or parsing failed
};

// tools: the request's OpenAI-shaped tools array ([{type:"function", function:{name, parameters}}]), used to
// reject unknown names and to type <parameter=K> values (string-typed keep raw text, others try JSON first).
// Any parse error or unknown tool name falls back to the whole text as content with no calls; so does any
// markup when `tools` is empty or null (no tool can be known, and tool_choice "none" means no parsing).
// Without <tool_call> blocks, a bare `<function=NAME>…</function>` is parsed the same way.
ParsedOutput parse_tool_calls(std::string_view text, const nlohmann::json& tools);

// Streaming gate for content: passes text through until a tool marker (`<tool_call>` or `<function`) starts,
// then holds everything (a tail that could begin a marker is held until resolved).
class ToolMarkupGate {
 public:
  std::string push(std::string_view text);
  // End of generation: the held-back tail when no marker ever started (else empty).
  std::string flush();
  bool triggered() const { return triggered_; }

 private:
  bool triggered_ = false;
  std::string held_;
};

// Gives every JSON-schema node without a "type" one inferred from enum/const/properties/items/anyOf (default
// "string"), so templates that read `type` never fail on a missing key. Returns the tools with that applied.
// The parameters root defaults to "object"; anyOf/oneOf/allOf give their first non-null member type.
nlohmann::json normalize_tool_schemas(const nlohmann::json& tools);
// The same, keeping key order (the order properties are listed in the rendered prompt).
nlohmann::ordered_json normalize_tool_schemas(const nlohmann::ordered_json& tools);

// A call's `arguments` sent as a JSON string (as OpenAI writes them) replaced by the value it holds, which is how
// chat templates read them; the string gets the request JSON limits first (deep nesting must not reach the
// template's recursion). Returns why it could not ("not valid JSON…"), or nothing (done, or nothing to do).
std::optional<std::string> parse_call_arguments(nlohmann::ordered_json& function);

}  // namespace lathe
