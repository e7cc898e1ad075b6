#include "chat/tool_calls.h"

#include <map>
#include <optional>
#include <random>

#include "chat/text_markers.h"
#include "io/json_guard.h"

namespace lathe {
namespace {

using json = nlohmann::json;
// Arguments keep the key order the model wrote, as Python's json.dumps does in mlx_lm.server.
using ojson = nlohmann::ordered_json;

// Model output parsed as JSON (discarded when invalid): the limits pass first, as for request bodies, since a
// prompt can steer a model into writing thousands of nested brackets.
ojson parse_limited(std::string_view text) {
  if (io::check_json(text, io::request_json_limits())) return ojson(ojson::value_t::discarded);
  return ojson::parse(text, nullptr, /*allow_exceptions=*/false);
}

constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";
constexpr std::string_view kFunctionOpen = "<function=";
constexpr std::string_view kFunctionClose = "</function>";
constexpr std::string_view kParamOpen = "<parameter=";
constexpr std::string_view kParamClose = "</parameter>";
constexpr std::string_view kGateFunction = "<function";

constexpr size_t npos = std::string_view::npos;

// Tool name → its `parameters` schema (nullptr when the tool declares none).
using Catalogue = std::map<std::string, const json*, std::less<>>;

Catalogue catalogue_of(const json& tools) {
  Catalogue out;
  if (!tools.is_array()) return out;
  for (const json& tool : tools) {
    if (!tool.is_object()) continue;
    // OpenAI nests the declaration under "function"; a flat {name, parameters} is accepted too.
    const json& fn = tool.contains("function") && tool["function"].is_object() ? tool["function"] : tool;
    if (!fn.contains("name") || !fn["name"].is_string()) continue;
    const json* params = fn.contains("parameters") ? &fn["parameters"] : nullptr;
    out[fn["name"].get<std::string>()] = params;
  }
  return out;
}

struct RawCall {
  std::string name;
  ojson arguments;
};

// {name, arguments} or {function:{name, arguments}}; arguments may be an object or a JSON string of one.
std::optional<RawCall> parse_json_call(std::string_view body) {
  const ojson j = parse_limited(body);
  if (!j.is_object()) return std::nullopt;  // also covers a parse error (discarded)
  const ojson& fn = j.contains("function") && j["function"].is_object() ? j["function"] : j;
  if (!fn.contains("name") || !fn["name"].is_string()) return std::nullopt;
  RawCall call{fn["name"].get<std::string>(), ojson::object()};
  const char* key = fn.contains("arguments") ? "arguments" : "parameters";
  if (!fn.contains(key) || fn[key].is_null()) return call;
  ojson args = fn[key];
  if (args.is_string()) {
    const std::string text = args.get<std::string>();
    if (trim_space(text).empty()) return call;
    args = parse_limited(text);
  }
  if (!args.is_object()) return std::nullopt;
  call.arguments = std::move(args);
  return call;
}

// True when the property schema allows only strings (and perhaps null): such values are never JSON-decoded,
// so "42" stays the string the tool asked for.
bool string_only(const json* schema) {
  if (!schema || !schema->is_object()) return false;
  bool saw_string = false;
  auto note = [&](const json& type) {
    if (!type.is_string()) return false;
    const auto& t = type.get_ref<const std::string&>();
    saw_string |= t == "string";
    return t == "string" || t == "null";
  };
  if (schema->contains("type")) {
    const json& type = (*schema)["type"];
    if (type.is_array()) {
      for (const json& t : type)
        if (!note(t)) return false;
    } else if (!note(type)) {
      return false;
    }
    return saw_string;
  }
  for (const char* alt : {"anyOf", "oneOf"}) {
    if (!schema->contains(alt) || !(*schema)[alt].is_array()) continue;
    for (const json& member : (*schema)[alt])
      if (!member.is_object() || !member.contains("type") || !note(member["type"])) return false;
    return saw_string;
  }
  return false;
}

const json* property_schema(const json* params, const std::string& key) {
  if (!params || !params->is_object() || !params->contains("properties")) return nullptr;
  const json& props = (*params)["properties"];
  if (!props.is_object() || !props.contains(key)) return nullptr;
  return &props[key];
}

ojson parameter_value(std::string_view raw, const json* schema) {
  // The model writes each value on its own lines: one newline after the opening tag and one before the close.
  if (!raw.empty() && raw.front() == '\n') raw.remove_prefix(1);
  if (!raw.empty() && raw.back() == '\n') raw.remove_suffix(1);
  if (string_only(schema)) return std::string(raw);
  ojson value = parse_limited(raw);
  if (value.is_discarded()) return std::string(raw);
  return value;
}

// `<function=NAME><parameter=K>V</parameter>…</function>`; a missing </parameter> or </function> (seen from
// Qwen3-Coder) ends at the next tag or at the end of the block. Anything else between tags is an error.
std::optional<RawCall> parse_xml_call(std::string_view body, const Catalogue& tools) {
  body = trim_space(body);
  if (!body.starts_with(kFunctionOpen)) return std::nullopt;
  body.remove_prefix(kFunctionOpen.size());
  const size_t gt = body.find('>');
  if (gt == npos) return std::nullopt;
  RawCall call{std::string(trim_space(body.substr(0, gt))), ojson::object()};
  if (call.name.empty()) return std::nullopt;
  body.remove_prefix(gt + 1);
  const auto tool = tools.find(call.name);
  const json* params = tool == tools.end() ? nullptr : tool->second;
  for (;;) {
    body = trim_space(body);
    if (body.empty()) break;
    if (body.starts_with(kFunctionClose)) {
      if (!trim_space(body.substr(kFunctionClose.size())).empty()) return std::nullopt;
      break;
    }
    if (!body.starts_with(kParamOpen)) return std::nullopt;
    body.remove_prefix(kParamOpen.size());
    const size_t key_end = body.find('>');
    if (key_end == npos) return std::nullopt;
    const std::string key(trim_space(body.substr(0, key_end)));
    if (key.empty()) return std::nullopt;
    body.remove_prefix(key_end + 1);
    size_t value_end = body.find(kParamClose);
    size_t next = value_end + kParamClose.size();
    // This value's close tag is missing when the next parameter opens first (or no close tag follows at all).
    if (const size_t next_param = body.find(kParamOpen); value_end == npos || next_param < value_end) {
      value_end = std::min({next_param, body.find(kFunctionClose), body.size()});
      next = value_end;
    }
    call.arguments[key] = parameter_value(body.substr(0, value_end), property_schema(params, key));
    body.remove_prefix(next);
  }
  return call;
}

std::optional<RawCall> parse_block(std::string_view body, const Catalogue& tools) {
  body = trim_space(body);
  if (body.starts_with("{")) return parse_json_call(body);
  return parse_xml_call(body, tools);
}

// Splits `text` into the blocks between `open` and `close` (an unclosed last block runs to the end, as when
// max_tokens cuts a call short) and the text outside them. include_tags keeps the markers in the blocks.
std::vector<std::string_view> find_blocks(std::string_view text, std::string_view open, std::string_view close,
                                          bool include_tags, std::string& outside) {
  std::vector<std::string_view> blocks;
  size_t pos = 0;
  for (size_t at; (at = text.find(open, pos)) != npos;) {
    outside.append(text.substr(pos, at - pos));
    const size_t body = include_tags ? at : at + open.size();
    const size_t end = text.find(close, at + open.size());
    if (end == npos) {
      blocks.push_back(text.substr(body));
      pos = text.size();
      break;
    }
    blocks.push_back(text.substr(body, (include_tags ? end + close.size() : end) - body));
    pos = end + close.size();
  }
  outside.append(text.substr(pos));
  return blocks;
}

std::string new_call_id() {
  // One generator per thread: no locking, and ids from concurrent requests still differ.
  thread_local std::mt19937 rng{std::random_device{}()};
  const uint32_t bits = rng();
  std::string id = "call_";
  for (int shift = 28; shift >= 0; shift -= 4) id.push_back("0123456789abcdef"[(bits >> shift) & 0xf]);
  return id;
}

}  // namespace

ParsedOutput parse_tool_calls(std::string_view text, const json& tools) {
  const ParsedOutput fallback{std::string(text), {}};
  std::string outside;
  std::vector<std::string_view> blocks = find_blocks(text, kCallOpen, kCallClose, false, outside);
  if (blocks.empty()) {
    outside.clear();
    blocks = find_blocks(text, kFunctionOpen, kFunctionClose, true, outside);
  }
  if (blocks.empty()) return fallback;
  // No tools declared means the request did not ask for calls (or tool_choice "none" dropped them), so nothing
  // can be a known tool: markup stays content.
  const Catalogue catalogue = catalogue_of(tools);
  ParsedOutput out;
  for (std::string_view block : blocks) {
    std::optional<RawCall> call = parse_block(block, catalogue);
    if (!call || !catalogue.contains(call->name)) return fallback;
    out.calls.push_back(
        {new_call_id(), std::move(call->name), call->arguments.dump(-1, ' ', false, ojson::error_handler_t::replace)});
  }
  out.content = std::string(trim_space(outside));
  return out;
}

std::string ToolMarkupGate::push(std::string_view text) {
  if (triggered_) return {};
  held_.append(text);
  const size_t at = std::min(held_.find(kCallOpen), held_.find(kGateFunction));
  if (at != npos) {
    triggered_ = true;
    std::string out = held_.substr(0, at);
    held_.clear();
    return out;
  }
  const size_t keep = partial_marker_length(held_, {kCallOpen, kGateFunction});
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string ToolMarkupGate::flush() {
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace lathe
