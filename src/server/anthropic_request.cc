#include "server/anthropic_request.h"

#include <algorithm>

#include "server/api_error.h"
#include "server/generation_flow.h"
#include "server/json_fields.h"
#include "server/openai_request.h"

namespace lathe::server {
namespace {

using ojson = nlohmann::ordered_json;

std::string block_text(const nlohmann::ordered_json& content, const std::string& field) {
  if (content.is_string()) return content.get<std::string>();
  if (content.is_null()) return {};
  if (!content.is_array()) throw invalid_field(field, field + " must be a string or an array of blocks");
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const auto& b = content[i];
    const std::string at = field + "[" + std::to_string(i) + "]";
    if (!b.is_object()) throw invalid_field(at, at + " must be an object");
    if (string_member(b, "type", "", at + ".type") != "text") continue;
    if (!b.contains("text") || !b["text"].is_string()) throw invalid_field(at + ".text", at + ".text must be a string");
    if (!text.empty()) text += "\n";
    text += b["text"].get<std::string>();
  }
  return text;
}

// One Anthropic message may expand to several chat messages (tool results are messages of their own).
// Text moves out of `m` (the request body's own message), so it is not held twice.
void translate_message(nlohmann::ordered_json& m, const std::string& at, ojson& out) {
  if (!m.is_object()) throw invalid_field(at, at + " must be an object");
  auto role_it = m.find("role");
  if (role_it == m.end() || !role_it->is_string())
    throw invalid_field(at + ".role", at + ".role must be \"user\" or \"assistant\"");
  const std::string role = role_it->get<std::string>() == "assistant" ? "assistant" : "user";
  auto content = m.find("content");
  if (content == m.end()) throw invalid_field(at + ".content", at + ".content is required");
  if (content->is_string()) {
    ojson msg = {{"role", role}};
    msg["content"] = std::move(content->get_ref<std::string&>());
    out.push_back(std::move(msg));
    return;
  }
  if (!content->is_array()) throw invalid_field(at + ".content", at + ".content must be a string or an array");
  std::string text;
  ojson calls = ojson::array();
  for (size_t i = 0; i < content->size(); ++i) {
    auto& b = (*content)[i];
    const std::string bat = at + ".content[" + std::to_string(i) + "]";
    if (!b.is_object() || !b.contains("type") || !b["type"].is_string())
      throw invalid_field(bat, bat + " must be a content block with a type");
    const std::string type = b["type"].get<std::string>();
    if (type == "text") {
      if (!b.contains("text") || !b["text"].is_string())
        throw invalid_field(bat + ".text", bat + ".text must be a string");
      std::string& block = b["text"].get_ref<std::string&>();
      if (text.empty()) {
        text = std::move(block);
      } else {
        if (!text.empty()) text += "\n";
        text += block;
        std::string().swap(block);
      }
    } else if (type == "tool_use") {
      if (!b.contains("name") || !b["name"].is_string())
        throw invalid_field(bat + ".name", bat + ".name must be a string");
      const std::string id =
          b.contains("id") && b["id"].is_string() ? b["id"].get<std::string>() : "toolu_" + random_hex(12);
      ojson input = b.contains("input") && b["input"].is_object() ? ojson(b["input"]) : ojson::object();
      calls.push_back({{"id", id}, {"type", "function"}, {"function", {{"name", b["name"]}, {"arguments", input}}}});
    } else if (type == "tool_result") {
      const std::string id = string_member(b, "tool_use_id", "", bat + ".tool_use_id");
      out.push_back(
          {{"role", "tool"},
           {"tool_call_id", id},
           {"content", block_text(b.contains("content") ? b["content"] : nlohmann::ordered_json(), bat + ".content")}});
    } else if (type == "image" || type == "document") {
      throw invalid_field(bat, "the served model does not accept " + type + " blocks");
    } else if (type != "thinking" && type != "redacted_thinking") {
      // (Dropping it would lose what the client sent: a message of such blocks alone vanished, and the template
      // then failed on the conversation with an error that named no field.)
      throw invalid_field(bat + ".type", bat + ".type '" + type +
                                             "' is not a content block this server takes (text, tool_use, "
                                             "tool_result, thinking, redacted_thinking)");
    }
    // thinking / redacted_thinking: dropped; the template decides what past reasoning looks like.
  }
  if (!text.empty() || !calls.empty()) {
    ojson msg = {{"role", role}};
    msg["content"] = std::move(text);
    if (!calls.empty()) msg["tool_calls"] = std::move(calls);
    out.push_back(std::move(msg));
  }
}

}  // namespace

ChatRequest parse_anthropic_messages(const nlohmann::ordered_json& body, const ServerDefaults& defaults) {
  nlohmann::ordered_json copy = body;
  return take_anthropic_messages(copy, defaults);
}

ChatRequest take_anthropic_messages(nlohmann::ordered_json& body, const ServerDefaults& defaults) {
  ChatRequest r;
  r.settings = parse_generation_settings(body, defaults, ApiSurface::Anthropic);
  const JsonFields f(body);
  if (auto s = body.find("system"); s != body.end() && !s->is_null()) {
    const std::string system = block_text(*s, "system");
    if (!system.empty()) r.messages.push_back({{"role", "system"}, {"content", system}});
  }
  const nlohmann::ordered_json* messages = f.array("messages");
  if (!messages || messages->empty()) throw invalid_field("messages", "messages must be a non-empty array");
  nlohmann::ordered_json& list = *body.find("messages");
  for (size_t i = 0; i < list.size(); ++i)
    translate_message(list[i], "messages[" + std::to_string(i) + "]", r.messages);
  if (std::none_of(r.messages.begin(), r.messages.end(),
                   [](const nlohmann::ordered_json& m) { return m.value("role", "") != "system"; }))
    throw invalid_field("messages", "messages hold no text, tool use or tool result to answer");

  // A last assistant message is a prefill: the reply continues it (and holds only the continuation).
  r.continue_final =
      !r.messages.empty() && r.messages.back()["role"] == "assistant" && !r.messages.back().contains("tool_calls");
  bool tools_off = false;
  if (const nlohmann::ordered_json* choice = f.object("tool_choice")) {
    const std::string type = string_member(*choice, "type", "", "tool_choice.type");
    if (type != "auto" && type != "any" && type != "tool" && type != "none")
      throw invalid_field("tool_choice.type", "tool_choice.type must be auto, any, tool or none");
    tools_off = type == "none";
    if (type == "any" || type == "tool") {
      std::string name;
      if (type == "tool") {
        name = string_member(*choice, "name", "", "tool_choice.name");
        if (name.empty()) throw invalid_field("tool_choice.name", "tool_choice.name is required for type tool");
      }
      r.settings.structured = StructuredOutput{StructuredOutput::Kind::ToolCall, {}, {}, name, "tool_choice"};
    }
  }
  if (const nlohmann::ordered_json* tools = f.array("tools")) {
    nlohmann::ordered_json fns = nlohmann::ordered_json::array();
    for (size_t i = 0; i < tools->size(); ++i) {
      const auto& t = (*tools)[i];
      // Server tools (web_search, …) have no input_schema: nothing a local model can run.
      if (!t.is_object() || !t.contains("name") || !t["name"].is_string() || !t.contains("input_schema")) continue;
      // Checked even under tool_choice none: a broken tool is a broken request.
      check_tool_schema(t["input_schema"], t["name"].get<std::string>(),
                        "tools[" + std::to_string(i) + "].input_schema", "tool");
      nlohmann::ordered_json fn = {{"name", t["name"]}, {"parameters", t["input_schema"]}};
      if (t.contains("description")) fn["description"] = t["description"];
      fns.push_back({{"type", "function"}, {"function", fn}});
    }
    if (!fns.empty() && !tools_off) r.tools = std::move(fns);
  }
  if (const nlohmann::ordered_json* thinking = f.object("thinking")) {
    // Anthropic's types; "adaptive" lets the model decide, which for a template switch means thinking on. The
    // budget is not enforced (the model stops thinking on its own), but a malformed one is still the client's.
    const std::string type = string_member(*thinking, "type", "", "thinking.type");
    if (type != "enabled" && type != "disabled" && type != "adaptive")
      throw invalid_field("thinking.type", "thinking.type must be enabled, disabled or adaptive");
    JsonFields(*thinking, "thinking.").integer("budget_tokens", 1, int64_t{1} << 30);
    r.template_kwargs["enable_thinking"] = type != "disabled";
  }
  return r;
}

}  // namespace lathe::server
