// normalize_tool_schemas (declared in tool_calls.h): gives every JSON-schema node in a tools array a "type".
#include "chat/tool_calls.h"

namespace lathe {
namespace {

template <typename Json>
std::string type_of_value(const Json& v) {
  if (v.is_string()) return "string";
  if (v.is_boolean()) return "boolean";
  if (v.is_number_integer()) return "integer";
  if (v.is_number()) return "number";
  if (v.is_array()) return "array";
  if (v.is_object()) return "object";
  return "null";
}

template <typename Json>
void normalize_node(Json& node, const char* default_type);

template <typename Json>
void normalize_each(Json& list) {
  if (!list.is_array()) return;
  for (Json& member : list) normalize_node(member, "string");
}

template <typename Json>
void normalize_values(Json& map) {
  if (!map.is_object()) return;
  for (auto it = map.begin(); it != map.end(); ++it) normalize_node(it.value(), "string");
}

// The type an alternative list implies: the first member type that is not "null" (anyOf [T, null] is the usual
// spelling of an optional T), else the first member type.
template <typename Json>
std::string type_of_alternatives(const Json& list) {
  std::string first;
  for (const Json& member : list) {
    if (!member.is_object() || !member.contains("type") || !member["type"].is_string()) continue;
    const std::string t = member["type"].template get<std::string>();
    if (t != "null") return t;
    if (first.empty()) first = t;
  }
  return first;
}

template <typename Json>
void normalize_node(Json& node, const char* default_type) {
  if (!node.is_object()) return;  // `true` / `false` schemas stay as they are
  // find(), not operator[]: indexing a missing key would add it.
  auto child = [&node](const char* key) -> Json* {
    auto it = node.find(key);
    return it == node.end() ? nullptr : &*it;
  };
  for (const char* map : {"properties", "$defs", "definitions"})
    if (Json* c = child(map)) normalize_values(*c);
  if (Json* items = child("items")) {
    if (items->is_array())
      normalize_each(*items);
    else
      normalize_node(*items, "string");
  }
  if (Json* extra = child("additionalProperties")) normalize_node(*extra, "string");
  for (const char* alt : {"anyOf", "oneOf", "allOf"})
    if (Json* c = child(alt)) normalize_each(*c);
  // A $ref node takes its type from the definition it points to; guessing one here could contradict it.
  if (node.contains("type") || node.contains("$ref")) return;

  std::string type;
  if (node.contains("enum") && node["enum"].is_array() && !node["enum"].empty()) {
    type = type_of_value(node["enum"].front());
  } else if (node.contains("const")) {
    type = type_of_value(node["const"]);
  } else if (node.contains("properties")) {
    type = "object";
  } else if (node.contains("items")) {
    type = "array";
  } else {
    for (const char* alt : {"anyOf", "oneOf", "allOf"}) {
      if (type.empty() && node.contains(alt) && node[alt].is_array()) type = type_of_alternatives(node[alt]);
    }
  }
  node["type"] = type.empty() ? default_type : type;
}

template <typename Json>
Json normalize_tools(const Json& tools) {
  Json out = tools;
  if (!out.is_array()) return out;
  for (Json& tool : out) {
    if (!tool.is_object()) continue;
    Json& fn = tool.contains("function") && tool["function"].is_object() ? tool["function"] : tool;
    // The parameters root is an object schema even when it is empty ({}), unlike a bare property.
    if (fn.contains("parameters")) normalize_node(fn["parameters"], "object");
  }
  return out;
}

}  // namespace

nlohmann::json normalize_tool_schemas(const nlohmann::json& tools) { return normalize_tools(tools); }
nlohmann::ordered_json normalize_tool_schemas(const nlohmann::ordered_json& tools) { return normalize_tools(tools); }

}  // namespace lathe
