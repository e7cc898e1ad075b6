// parse_call_arguments (declared in tool_calls.h): shared by the chat request surfaces and the fine-tune loader.
#include "chat/tool_calls.h"
#include "io/json_guard.h"

namespace lathe {

std::optional<std::string> parse_call_arguments(nlohmann::ordered_json& function) {
  auto args = function.find("arguments");
  if (args == function.end() || !args->is_string()) return std::nullopt;
  const std::string text = args->get<std::string>();
  if (auto err = io::check_json_limits(text, io::request_json_limits())) return "not valid JSON: " + *err;
  try {
    *args = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::ordered_json::parse_error&) {
    return std::string("not valid JSON");
  }
  return std::nullopt;
}

}  // namespace lathe
