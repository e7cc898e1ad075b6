#include "chat/chat_template.h"

#include <filesystem>

#include "common/error.h"
#include "io/json_guard.h"
#include "io/mapped_file.h"

namespace lathe {
namespace {

using json = nlohmann::ordered_json;

std::string read_file(const std::filesystem::path& path) { return read_text_file(path.string()); }

std::string token_text(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return {};
}

// Python's datetime.now().strftime(fmt), which transformers exposes to templates as strftime_now.
std::string format_time(const std::string& fmt, std::time_t when) {
  std::tm local{};
  localtime_r(&when, &local);
  if (fmt.empty()) return {};
  std::string buf(fmt.size() * 4 + 64, '\0');
  const size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &local);
  buf.resize(n);
  return buf;
}

}  // namespace

json special_tokens_from_config(const json& config) {
  json tokens = json::object();
  static const char* const kNames[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                       "pad_token", "cls_token", "mask_token"};
  for (const char* name : kNames) {
    if (!config.contains(name)) continue;
    const std::string text = token_text(config[name]);
    if (!text.empty()) tokens[name] = text;
  }
  if (config.contains("additional_special_tokens") && config["additional_special_tokens"].is_array()) {
    json list = json::array();
    for (const json& t : config["additional_special_tokens"]) list.push_back(token_text(t));
    tokens["additional_special_tokens"] = list;
  }
  if (config.contains("extra_special_tokens") && config["extra_special_tokens"].is_object())
    for (const auto& [name, t] : config["extra_special_tokens"].items())
      if (!tokens.contains(name) && !token_text(t).empty()) tokens[name] = token_text(t);
  return tokens;
}

ChatTemplate::ChatTemplate(const std::string& source, json special_tokens)
    : ChatTemplate(std::vector<std::pair<std::string, std::string>>{{"default", source}}, std::move(special_tokens)) {}

ChatTemplate::ChatTemplate(const std::vector<std::pair<std::string, std::string>>& named_sources, json special_tokens)
    : special_tokens_(std::move(special_tokens)) {
  if (named_sources.empty()) throw Error(ErrorKind::InvalidArgument, "no chat template given");
  for (const auto& [name, source] : named_sources) {
    try {
      templates_.emplace_back(name, jinja::Template(source));
      source_text_ += source;
    } catch (const Error& e) {
      throw Error(e.kind(), "chat template '" + name + "': " + e.what());
    }
  }
}

ChatTemplate ChatTemplate::from_dir(const std::string& dir) {
  const std::filesystem::path root(dir);
  json config = json::object();
  const auto config_path = root / "tokenizer_config.json";
  if (std::filesystem::exists(config_path)) {
    config = io::parse_ordered_json_checked(read_file(config_path), io::file_json_limits(), ErrorKind::Corrupt,
                                            config_path.string());
  }
  json tokens = special_tokens_from_config(config);
  const auto jinja_path = root / "chat_template.jinja";
  if (std::filesystem::exists(jinja_path)) return ChatTemplate(read_file(jinja_path), std::move(tokens));
  const json* source = config.contains("chat_template") ? &config["chat_template"] : nullptr;
  if (!source || source->is_null())
    throw Error(ErrorKind::NotFound, dir + ": no chat_template.jinja and no chat_template in tokenizer_config.json");
  if (source->is_string()) return ChatTemplate(source->get<std::string>(), std::move(tokens));
  if (!source->is_array())
    throw Error(ErrorKind::Corrupt, config_path.string() + ": chat_template must be a string or a list");
  std::vector<std::pair<std::string, std::string>> named;
  for (const json& entry : *source) {
    if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") || !entry["name"].is_string() ||
        !entry["template"].is_string())
      throw Error(ErrorKind::Corrupt, config_path.string() + ": chat_template entries need a name and a template");
    named.emplace_back(entry["name"].get<std::string>(), entry["template"].get<std::string>());
  }
  return ChatTemplate(named, std::move(tokens));
}

const jinja::Template& ChatTemplate::pick(bool has_tools) const {
  if (has_tools)
    for (const auto& [name, t] : templates_)
      if (name == "tool_use") return t;
  for (const auto& [name, t] : templates_)
    if (name == "default") return t;
  return templates_.front().second;
}

std::string ChatTemplate::render(const ChatTemplateInput& input) const {
  if (!input.messages.is_array()) throw Error(ErrorKind::InvalidArgument, "messages must be a list");
  return render_values(input, jinja::from_json(input.messages), jinja::from_json(input.tools));
}

std::string ChatTemplate::render(ChatTemplateInput&& input) const {
  if (!input.messages.is_array()) throw Error(ErrorKind::InvalidArgument, "messages must be a list");
  const bool has_tools = !input.tools.is_null();
  jinja::Value messages = jinja::from_json(std::move(input.messages));
  jinja::Value tools = jinja::from_json(std::move(input.tools));
  input.messages = nlohmann::ordered_json::array();  // what the moves left: containers of empty strings
  input.tools = has_tools ? nlohmann::ordered_json::array() : nlohmann::ordered_json();
  return render_values(input, std::move(messages), std::move(tools), has_tools);
}

std::string ChatTemplate::render_values(const ChatTemplateInput& input, jinja::Value messages, jinja::Value tools,
                                        std::optional<bool> has_tools) const {
  using jinja::Value;
  if (!input.kwargs.is_object() && !input.kwargs.is_null())
    throw Error(ErrorKind::InvalidArgument, "template kwargs must be an object");
  jinja::ValueDict vars;
  for (const auto& [name, token] : special_tokens_.items()) vars.set(name, jinja::from_json(token));
  vars.set("messages", std::move(messages));
  vars.set("tools", std::move(tools));
  vars.set("documents", Value::none());
  vars.set("add_generation_prompt", Value(input.add_generation_prompt));
  if (input.kwargs.is_object())
    for (const auto& [name, v] : input.kwargs.items()) vars.set(name, jinja::from_json(v));
  vars.set("raise_exception", Value::function("raise_exception", [](const jinja::CallArgs& args) -> Value {
             const jinja::Value* message = args.get(0, "message");
             throw jinja::TemplateRaised(message ? message->str() : "raise_exception called");
           }));
  const std::time_t now = input.now.value_or(std::time(nullptr));
  vars.set("strftime_now", Value::function("strftime_now", [now](const jinja::CallArgs& args) {
             const jinja::Value* fmt = args.get(0, "format");
             return Value(format_time(fmt ? fmt->str() : "", now));
           }));
  jinja::RenderLimits limits = jinja::default_render_limits();
  limits.cancel = input.cancel;
  return pick(has_tools.value_or(!input.tools.is_null())).render(vars, limits);
}

}  // namespace lathe
