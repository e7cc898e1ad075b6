#include "server/openai_request.h"

#include <optional>
#include <set>
#include <string>

#include "chat/grammar/schema_check.h"
#include "chat/tool_calls.h"
#include "server/api_error.h"
#include "server/json_fields.h"

namespace lathe::server {

std::string content_part_text(const nlohmann::ordered_json& part, const std::string& at) {
  if (!part.is_object()) throw invalid_field(at, at + " must be an object");
  const std::string type = string_member(part, "type", "text", at + ".type");
  if (type == "image_url" || type == "image" || type == "input_image")
    throw invalid_field(at, "the served model does not accept images");
  if (type == "input_audio") throw invalid_field(at, "the served model does not accept audio");
  if (type == "file" || type == "input_file") throw invalid_field(at, "the served model does not accept files");
  // A past assistant turn may hold a refusal part: its text is what was said.
  const char* key = type == "refusal" ? "refusal" : "text";
  if (type != "text" && type != "input_text" && type != "output_text" && type != "refusal")
    throw invalid_field(at + ".type", at + ".type '" + type +
                                          "' is not a content part this server takes (text, input_text, "
                                          "output_text, refusal)");
  auto t = part.find(key);
  if (t == part.end()) return {};
  if (!t->is_string()) throw invalid_field(at + "." + key, at + "." + key + " must be a string");
  return t->get<std::string>();
}

namespace {

using ojson = nlohmann::ordered_json;

std::string flatten_parts(const nlohmann::ordered_json& parts, const std::string& field) {
  std::string text;
  for (size_t i = 0; i < parts.size(); ++i) text += content_part_text(parts[i], field + "[" + std::to_string(i) + "]");
  return text;
}

// Templates iterate a call's arguments as a mapping; clients send them as a JSON string.
void parse_arguments(ojson& fn, const std::string& at) {
  if (auto why = parse_call_arguments(fn)) throw invalid_field(at + ".arguments", at + ".arguments is " + *why);
}

ojson parse_tool_calls_field(const nlohmann::ordered_json& calls, const std::string& field) {
  if (!calls.is_array()) throw invalid_field(field, field + " must be an array");
  ojson out = ojson::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    const std::string at = field + "[" + std::to_string(i) + "]";
    const auto& c = calls[i];
    if (!c.is_object() || !c.contains("function") || !c["function"].is_object())
      throw invalid_field(at, at + " must be an object with a function");
    const auto& fn = c["function"];
    if (!fn.contains("name") || !fn["name"].is_string())
      throw invalid_field(at + ".function.name", at + ".function.name must be a string");
    ojson call = ojson(c);
    parse_arguments(call["function"], at + ".function");
    out.push_back(std::move(call));
  }
  return out;
}

// An assistant turn's deprecated function_call {name, arguments} as the one tool call it stands for.
ojson legacy_function_call(const nlohmann::ordered_json& fc, const std::string& at, size_t message_index) {
  if (!fc.is_object() || !fc.contains("name") || !fc["name"].is_string())
    throw invalid_field(at, at + " must be an object with a string name");
  ojson fn = fc;
  parse_arguments(fn, at);
  return ojson::array({{{"id", "call_" + std::to_string(message_index)}, {"type", "function"}, {"function", fn}}});
}

// Each message is checked, then moved out of the body (its text is not copied).
ojson parse_messages(nlohmann::ordered_json& body) {
  auto it = body.find("messages");
  if (it == body.end() || it->is_null()) throw invalid_field("messages", "messages is required");
  if (!it->is_array()) throw invalid_field("messages", "messages must be an array");
  if (it->empty()) throw invalid_field("messages", "messages must not be empty");
  // "function": the deprecated spelling of a tool result (with the function's name).
  static const std::set<std::string> roles = {"system", "user", "assistant", "tool", "developer", "function"};
  ojson out = ojson::array();
  out.get_ref<ojson::array_t&>().reserve(it->size());
  for (size_t i = 0; i < it->size(); ++i) {
    auto& m = (*it)[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) throw invalid_field(at, at + " must be an object");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) throw invalid_field(at + ".role", at + ".role must be a string");
    if (!roles.count(role->get<std::string>()))
      throw invalid_field(at + ".role", at + ".role must be one of system, user, assistant, tool, developer");
    const bool developer = *role == "developer";
    const bool function_result = *role == "function";
    if (function_result && (!m.contains("name") || !m["name"].is_string()))
      throw invalid_field(at + ".name", at + ".name must be a string (the function whose result this is)");
    auto content = m.find("content");
    // OpenAI clients send `content: null` (or none) on assistant tool-call turns; templates such as Qwen3's
    // test `'</think>' in message.content`, which fails on null, so it renders as "" (as mlx_lm.server does).
    const bool no_content = content == m.end() || content->is_null();
    std::optional<std::string> flattened;
    if (!no_content) {
      if (content->is_array())
        flattened = flatten_parts(*content, at + ".content");
      else if (!content->is_string())
        throw invalid_field(at + ".content", at + ".content must be a string, an array of parts or null");
    }
    ojson tool_calls;
    if (m.contains("tool_calls") && !m["tool_calls"].is_null())
      tool_calls = parse_tool_calls_field(m["tool_calls"], at + ".tool_calls");
    else if (m.contains("function_call") && !m["function_call"].is_null())
      tool_calls = legacy_function_call(m["function_call"], at + ".function_call", i);
    if (m.contains("tool_call_id") && !m["tool_call_id"].is_string() && !m["tool_call_id"].is_null())
      throw invalid_field(at + ".tool_call_id", at + ".tool_call_id must be a string");
    ojson msg = std::move(m);
    if (developer) msg["role"] = "system";
    if (function_result) msg["role"] = "tool";
    msg.erase("function_call");
    if (no_content) msg["content"] = "";
    if (flattened) msg["content"] = std::move(*flattened);
    if (!tool_calls.is_null()) msg["tool_calls"] = std::move(tool_calls);
    out.push_back(std::move(msg));
  }
  return out;
}

}  // namespace

void check_tool_schema(const nlohmann::ordered_json& schema, const std::string& tool, const std::string& field,
                       const char* noun) {
  // The name as OpenAI quotes it, cut so that a huge name does not make a huge message.
  const std::string name = tool.size() > 64 ? tool.substr(0, 64) + "..." : tool;
  const std::string lead = std::string("Invalid schema for ") + noun + " '" + name + "': ";
  if (!schema.is_object())
    throw ApiError(400, lead + field + " must be a JSON Schema object, not a JSON " + schema.type_name(), field,
                   "invalid_function_parameters");
  if (auto problem = grammar::find_schema_problem(schema, field))
    throw ApiError(400, lead + problem->path + ": " + problem->why, field, "invalid_function_parameters");
}

void check_tools(const nlohmann::ordered_json& tools, const char* field) {
  if (!tools.is_array()) throw invalid_field(field, std::string(field) + " must be an array");
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string at = std::string(field) + "[" + std::to_string(i) + "]";
    const auto& t = tools[i];
    if (!t.is_object() || !t.contains("function") || !t["function"].is_object())
      throw invalid_field(at, at + " must be {\"type\": \"function\", \"function\": {...}}");
    const auto& fn = t["function"];
    if (!fn.contains("name") || !fn["name"].is_string())
      throw invalid_field(at + ".function.name", at + ".function.name must be a string");
    // null stands for no parameters, as an absent field does.
    if (auto p = fn.find("parameters"); p != fn.end() && !p->is_null())
      check_tool_schema(*p, fn["name"].get<std::string>(), at + ".function.parameters", "function");
  }
}

namespace {

// Which of OpenAI's deprecated fields a request sent.
struct LegacyFunctions {
  bool functions = false, function_call = false;
};

// OpenAI's deprecated `functions` and `function_call` fields, rewritten in the body as the `tools` and
// `tool_choice` they stand for.
LegacyFunctions take_legacy_functions(nlohmann::ordered_json& body) {
  LegacyFunctions legacy;
  if (auto fs = body.find("functions"); fs != body.end() && !fs->is_null()) {
    if (auto t = body.find("tools"); t != body.end() && !t->is_null())
      throw invalid_field("functions", "send tools or functions (deprecated), not both");
    if (!fs->is_array()) throw invalid_field("functions", "functions must be an array");
    ojson tools = ojson::array();
    for (size_t i = 0; i < fs->size(); ++i) {
      const std::string at = "functions[" + std::to_string(i) + "]";
      const auto& fn = (*fs)[i];
      if (!fn.is_object() || !fn.contains("name") || !fn["name"].is_string())
        throw invalid_field(at, at + " must be an object with a string name");
      if (auto p = fn.find("parameters"); p != fn.end() && !p->is_null())
        check_tool_schema(*p, fn["name"].get<std::string>(), at + ".parameters", "function");
      tools.push_back({{"type", "function"}, {"function", fn}});
    }
    body["tools"] = std::move(tools);
    body.erase("functions");
    legacy.functions = true;
  }
  if (auto fc = body.find("function_call"); fc != body.end() && !fc->is_null()) {
    if (auto t = body.find("tool_choice"); t != body.end() && !t->is_null())
      throw invalid_field("function_call", "send tool_choice or function_call (deprecated), not both");
    const char* msg = "function_call must be none, auto or {\"name\": …}";
    ojson choice;
    if (fc->is_string() && (*fc == "none" || *fc == "auto"))
      choice = *fc;
    else if (fc->is_object() && fc->contains("name") && (*fc)["name"].is_string())
      choice = {{"type", "function"}, {"function", {{"name", (*fc)["name"]}}}};
    else
      throw invalid_field("function_call", msg);
    body["tool_choice"] = std::move(choice);
    body.erase("function_call");
    legacy.function_call = true;
  }
  return legacy;
}

}  // namespace

ChatRequest parse_openai_chat(const nlohmann::ordered_json& body, const ServerDefaults& defaults) {
  nlohmann::ordered_json copy = body;
  return take_openai_chat(copy, defaults);
}

ChatRequest take_openai_chat(nlohmann::ordered_json& body, const ServerDefaults& defaults) {
  ChatRequest r;
  r.settings = parse_generation_settings(body, defaults, ApiSurface::OpenAI);
  r.messages = parse_messages(body);
  const LegacyFunctions legacy = take_legacy_functions(body);
  r.legacy_functions = legacy.functions || legacy.function_call;
  const JsonFields f(body);
  bool tools_off = false;
  bool forced = false;
  std::string forced_name;
  if (auto it = body.find("tool_choice"); it != body.end() && !it->is_null()) {
    const char* msg =
        "tool_choice must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": …}}";
    if (it->is_string()) {
      const std::string c = it->get<std::string>();
      if (c != "none" && c != "auto" && c != "required") throw invalid_field("tool_choice", msg);
      tools_off = c == "none";
      forced = c == "required";
    } else if (it->is_object()) {
      auto fn = it->find("function");
      if (fn == it->end() || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string())
        throw invalid_field("tool_choice", msg);
      forced = true;
      forced_name = (*fn)["name"].get<std::string>();
    } else {
      throw invalid_field("tool_choice", msg);
    }
  }
  // Checked even when tool_choice is "none" (as OpenAI does): a broken tool is a broken request.
  if (const nlohmann::ordered_json* tools = f.array("tools")) {
    check_tools(*tools, "tools");
    if (!tools_off) r.tools = std::move(body["tools"]);
  }
  if (forced) {
    // The call is enforced by a grammar over the template's tool-call markup (structured_output.h).
    r.settings.structured = StructuredOutput{
        StructuredOutput::Kind::ToolCall, {}, {}, forced_name, legacy.function_call ? "function_call" : "tool_choice"};
  }

  if (const nlohmann::ordered_json* kw = f.object("chat_template_kwargs"))
    for (const auto& [k, v] : kw->items()) r.template_kwargs[k] = v;
  if (auto effort = f.string("reasoning_effort")) {
    static const std::set<std::string> levels = {"none", "minimal", "low", "medium", "high"};
    if (!levels.count(*effort))
      throw invalid_field("reasoning_effort", "reasoning_effort must be one of none, minimal, low, medium, high");
    // An explicit chat_template_kwargs.enable_thinking wins over the effort level.
    if (!r.template_kwargs.contains("enable_thinking")) r.template_kwargs["enable_thinking"] = *effort != "none";
  }
  if (r.template_kwargs.contains("enable_thinking") && !r.template_kwargs["enable_thinking"].is_boolean())
    throw invalid_field("chat_template_kwargs.enable_thinking", "chat_template_kwargs.enable_thinking must be a bool");
  return r;
}

}  // namespace lathe::server
