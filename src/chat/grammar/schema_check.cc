#include "chat/grammar/schema_check.h"

#include <cmath>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/limits.h"

namespace lathe::grammar {
namespace {

using ojson = nlohmann::ordered_json;

constexpr size_t kMaxNameInPath = 64;  // bytes of a property name or $ref quoted in a message

// A name as a message quotes it: cut at a UTF-8 boundary, so that a megabyte key does not make a megabyte message.
std::string shown(std::string_view s) {
  if (s.size() <= kMaxNameInPath) return std::string(s);
  size_t n = kMaxNameInPath;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return std::string(s.substr(0, n)) + "...";
}

std::string a_kind(const ojson& v) {
  if (v.is_object()) return "an object";
  if (v.is_array()) return "an array";
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  return "null";
}

// What each keyword's value must be. Keywords not listed are annotations or unknown: not checked.
enum class Shape {
  Schema,             // a schema
  SchemaMap,          // an object of schemas
  SchemaList,         // a non-empty array of schemas
  Items,              // a schema, or (drafts 4-7) an array of schemas
  Type,               // a type name or a non-empty array of distinct ones
  Names,              // an array of strings
  Array,              // any array (enum)
  Count,              // a non-negative integer
  Number,             // a number
  NumberOrBool,       // a number, or a boolean (draft 4's exclusiveMinimum/Maximum)
  Positive,           // a number above 0 (multipleOf)
  String,             // a string
  Ref,                // a string that resolves
  Dependencies,       // draft 4-7: an object of schemas or arrays of names
  DependentRequired,  // an object of arrays of names
  Anchor,             // a string, registered for "#name" refs
  Id,                 // a string, registered for refs that name it
};

const std::unordered_map<std::string_view, Shape>& shapes() {
  static const std::unordered_map<std::string_view, Shape> k = {
      {"additionalProperties", Shape::Schema},
      {"additionalItems", Shape::Schema},
      {"unevaluatedProperties", Shape::Schema},
      {"unevaluatedItems", Shape::Schema},
      {"contains", Shape::Schema},
      {"propertyNames", Shape::Schema},
      {"not", Shape::Schema},
      {"if", Shape::Schema},
      {"then", Shape::Schema},
      {"else", Shape::Schema},
      {"contentSchema", Shape::Schema},
      {"properties", Shape::SchemaMap},
      {"patternProperties", Shape::SchemaMap},
      {"$defs", Shape::SchemaMap},
      {"definitions", Shape::SchemaMap},
      {"dependentSchemas", Shape::SchemaMap},
      {"allOf", Shape::SchemaList},
      {"anyOf", Shape::SchemaList},
      {"oneOf", Shape::SchemaList},
      {"prefixItems", Shape::SchemaList},
      {"items", Shape::Items},
      {"type", Shape::Type},
      {"required", Shape::Names},
      {"enum", Shape::Array},
      {"minLength", Shape::Count},
      {"maxLength", Shape::Count},
      {"minItems", Shape::Count},
      {"maxItems", Shape::Count},
      {"minProperties", Shape::Count},
      {"maxProperties", Shape::Count},
      {"minContains", Shape::Count},
      {"maxContains", Shape::Count},
      {"minimum", Shape::Number},
      {"maximum", Shape::Number},
      {"exclusiveMinimum", Shape::NumberOrBool},
      {"exclusiveMaximum", Shape::NumberOrBool},
      {"multipleOf", Shape::Positive},
      {"pattern", Shape::String},
      {"format", Shape::String},
      {"$dynamicRef", Shape::String},
      {"$ref", Shape::Ref},
      {"dependencies", Shape::Dependencies},
      {"dependentRequired", Shape::DependentRequired},
      {"$anchor", Shape::Anchor},
      {"$dynamicAnchor", Shape::Anchor},
      {"$id", Shape::Id},
  };
  return k;
}

bool is_type_name(const std::string& t) {
  return t == "string" || t == "number" || t == "integer" || t == "boolean" || t == "object" || t == "array" ||
         t == "null";
}

bool is_count(const ojson& v) {
  if (v.is_number_unsigned()) return true;
  if (v.is_number_integer()) return v.get<int64_t>() >= 0;
  if (v.is_number_float()) {  // 2.0 is an integer to JSON Schema
    const double d = v.get<double>();
    return std::isfinite(d) && d >= 0 && d == std::floor(d);
  }
  return false;
}

struct Found {
  SchemaProblem problem;
};

[[noreturn]] void fail(const std::string& path, const std::string& why) { throw Found{{path, why}}; }

class Checker {
 public:
  Checker(const ojson& root, const std::string& at) : root_(root), at_(at) {}

  void run() {
    schema(root_, at_, 0);
    // refs_ grows while targets outside schema positions are checked; anchors are all known once it stops.
    std::vector<size_t> anchor_refs;
    for (size_t i = 0; i < refs_.size(); ++i)
      if (!resolve(i, false)) anchor_refs.push_back(i);
    for (size_t i : anchor_refs) resolve(i, true);
  }

 private:
  struct Ref {
    std::string ref;
    std::string path;  // of the $ref keyword
  };

  void schema(const ojson& s, const std::string& path, int depth) {
    if (depth > limits::kJsonMaxDepth)
      fail(path, "the schema nests deeper than " + std::to_string(limits::kJsonMaxDepth) + " levels");
    if (!visited_.insert(&s).second) return;
    if (s.is_boolean()) return;
    if (!s.is_object()) fail(path, "a schema must be an object or a boolean, not " + a_kind(s));
    for (const auto& [k, v] : s.items()) {
      const auto shape = shapes().find(k);
      if (shape != shapes().end()) keyword(shape->second, k, v, s, path, depth);
    }
  }

  void keyword(Shape shape, const std::string& k, const ojson& v, const ojson& owner, const std::string& path,
               int depth) {
    const std::string at = path + "." + k;
    switch (shape) {
      case Shape::Schema: schema(v, at, depth + 1); return;
      case Shape::SchemaMap:
        if (!v.is_object()) fail(at, k + " must be an object mapping names to schemas, not " + a_kind(v));
        for (const auto& [name, sub] : v.items()) schema(sub, at + "." + shown(name), depth + 1);
        return;
      case Shape::SchemaList:
        if (!v.is_array() || v.empty()) fail(at, k + " must be a non-empty array of schemas, not " + a_kind(v));
        for (size_t i = 0; i < v.size(); ++i) schema(v[i], at + "[" + std::to_string(i) + "]", depth + 1);
        return;
      case Shape::Items:
        if (v.is_array()) {
          for (size_t i = 0; i < v.size(); ++i) schema(v[i], at + "[" + std::to_string(i) + "]", depth + 1);
          return;
        }
        schema(v, at, depth + 1);
        return;
      case Shape::Type: type(v, at); return;
      case Shape::Names: names(v, at, k); return;
      case Shape::Array:
        if (!v.is_array()) fail(at, k + " must be an array of values, not " + a_kind(v));
        return;
      case Shape::Count:
        if (!is_count(v)) fail(at, k + " must be a non-negative integer, not " + shown(v.dump()));
        return;
      case Shape::Number:
        if (!v.is_number()) fail(at, k + " must be a number, not " + a_kind(v));
        return;
      case Shape::NumberOrBool:
        if (!v.is_number() && !v.is_boolean()) fail(at, k + " must be a number, not " + a_kind(v));
        return;
      case Shape::Positive:
        if (!v.is_number() || !(v.get<double>() > 0)) fail(at, k + " must be a number above 0");
        return;
      case Shape::String:
        if (!v.is_string()) fail(at, k + " must be a string, not " + a_kind(v));
        return;
      case Shape::Ref:
        if (!v.is_string()) fail(at, "$ref must be a string, not " + a_kind(v));
        refs_.push_back({v.get<std::string>(), at});
        return;
      case Shape::Dependencies:
        if (!v.is_object()) fail(at, k + " must be an object, not " + a_kind(v));
        for (const auto& [name, dep] : v.items()) {
          if (dep.is_array())
            names(dep, at + "." + shown(name), k + "." + shown(name));
          else
            schema(dep, at + "." + shown(name), depth + 1);
        }
        return;
      case Shape::DependentRequired:
        if (!v.is_object()) fail(at, k + " must be an object mapping names to arrays of names, not " + a_kind(v));
        for (const auto& [name, dep] : v.items()) names(dep, at + "." + shown(name), k + "." + shown(name));
        return;
      case Shape::Anchor:
        if (!v.is_string()) fail(at, k + " must be a string, not " + a_kind(v));
        anchors_.emplace(v.get<std::string>(), &owner);
        return;
      case Shape::Id: {
        if (!v.is_string()) fail(at, k + " must be a string, not " + a_kind(v));
        std::string id = v.get<std::string>();
        if (!id.empty() && id[0] == '#') {  // drafts 6-7 spell an anchor as "$id": "#name"
          anchors_.emplace(id.substr(1), &owner);
        } else {
          if (!id.empty() && id.back() == '#') id.pop_back();
          ids_.emplace(id, &owner);
        }
        return;
      }
    }
  }

  void type(const ojson& v, const std::string& at) {
    const std::string expected = "one of string, number, integer, boolean, object, array, null";
    if (v.is_string()) {
      if (!is_type_name(v.get<std::string>()))
        fail(at, "type " + shown(v.dump()) + " is not a JSON-Schema type (" + expected + ")");
      return;
    }
    if (!v.is_array() || v.empty())
      fail(at, "type must be a type name or a non-empty array of them (" + expected + "), not " + a_kind(v));
    std::unordered_set<std::string> seen;
    for (size_t i = 0; i < v.size(); ++i) {
      const std::string item_at = at + "[" + std::to_string(i) + "]";
      if (!v[i].is_string() || !is_type_name(v[i].get<std::string>()))
        fail(item_at, shown(v[i].dump()) + " is not a JSON-Schema type (" + expected + ")");
      if (!seen.insert(v[i].get<std::string>()).second) fail(item_at, "type lists " + v[i].dump() + " twice");
    }
  }

  void names(const ojson& v, const std::string& at, const std::string& what) {
    if (!v.is_array()) fail(at, what + " must be an array of property names, not " + a_kind(v));
    for (size_t i = 0; i < v.size(); ++i)
      if (!v[i].is_string())
        fail(at + "[" + std::to_string(i) + "]", what + " must hold property names (strings), not " + a_kind(v[i]));
  }

  // Resolves refs_[i] and checks its target as a schema when nothing has yet. Returns false for an anchor that
  // is not known yet (and !last: asked again once every ref has been followed).
  bool resolve(size_t i, bool last) {
    const std::string ref = refs_[i].ref;  // a copy: checking a target may grow refs_
    const std::string at = refs_[i].path;
    const std::string unresolvable = "$ref \"" + shown(ref) + "\" cannot be resolved: ";
    const size_t hash = ref.find('#');
    const std::string base = ref.substr(0, hash);
    const ojson* doc = &root_;
    std::string target_path = at_;
    if (!base.empty()) {
      const auto id = ids_.find(base);
      if (id == ids_.end())
        fail(at, unresolvable +
                     "it points outside this schema (references within it, such as \"#/$defs/name\", are resolved)");
      doc = id->second;
      target_path = at;
    }
    const std::string fragment = hash == std::string::npos ? "" : ref.substr(hash + 1);
    const ojson* target = doc;
    if (!fragment.empty() && fragment[0] != '/') {
      const auto anchor = anchors_.find(fragment);
      if (anchor == anchors_.end()) {
        if (!last) return false;
        fail(at, unresolvable + "no subschema declares the anchor \"" + shown(fragment) + "\"");
      }
      target = anchor->second;
      target_path = at;
    } else if (!fragment.empty()) {
      target = pointer(*doc, fragment, at, unresolvable, target_path);
    }
    if (!target->is_object() && !target->is_boolean())
      fail(at, "$ref \"" + shown(ref) + "\" points at " + a_kind(*target) + ", not a schema");
    schema(*target, target_path, 0);
    return true;
  }

  // The node a JSON pointer (percent-encoded, as in a URI fragment) names under `doc`; `path` follows it.
  const ojson* pointer(const ojson& doc, const std::string& fragment, const std::string& at,
                       const std::string& unresolvable, std::string& path) {
    std::string decoded;
    for (size_t i = 0; i < fragment.size(); ++i) {
      if (fragment[i] != '%') {
        decoded += fragment[i];
        continue;
      }
      const auto hex = [](char c) {
        return c >= '0' && c <= '9'   ? c - '0'
               : c >= 'a' && c <= 'f' ? c - 'a' + 10
               : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                      : -1;
      };
      if (i + 2 >= fragment.size() || hex(fragment[i + 1]) < 0 || hex(fragment[i + 2]) < 0)
        fail(at, unresolvable + "a malformed %-escape");
      decoded += static_cast<char>(hex(fragment[i + 1]) * 16 + hex(fragment[i + 2]));
      i += 2;
    }
    const ojson* node = &doc;
    size_t start = 1;  // past the leading '/'
    while (start <= decoded.size()) {
      size_t end = decoded.find('/', start);
      if (end == std::string::npos) end = decoded.size();
      std::string token;
      for (size_t i = start; i < end; ++i) {
        if (decoded[i] != '~') {
          token += decoded[i];
        } else if (i + 1 < end && (decoded[i + 1] == '0' || decoded[i + 1] == '1')) {
          token += decoded[++i] == '0' ? '~' : '/';
        } else {
          fail(at, unresolvable + "'~' in a JSON pointer must be followed by 0 or 1");
        }
      }
      if (node->is_object()) {
        const auto it = node->find(token);
        if (it == node->end()) fail(at, unresolvable + "there is no \"" + shown(token) + "\" at " + path);
        node = &*it;
        path += "." + shown(token);
      } else if (node->is_array()) {
        const bool digits = !token.empty() && token.size() <= 9 &&
                            token.find_first_not_of("0123456789") == std::string::npos &&
                            (token == "0" || token[0] != '0');
        if (!digits || std::stoul(token) >= node->size())
          fail(at, unresolvable + "there is no item \"" + shown(token) + "\" in the array at " + path);
        node = &(*node)[std::stoul(token)];
        path += "[" + token + "]";
      } else {
        fail(at, unresolvable + path + " is " + a_kind(*node) + ", which has no \"" + shown(token) + "\"");
      }
      start = end + 1;
    }
    return node;
  }

  const ojson& root_;
  const std::string& at_;
  std::unordered_set<const ojson*> visited_;
  std::vector<Ref> refs_;
  std::unordered_map<std::string, const ojson*> anchors_;
  std::unordered_map<std::string, const ojson*> ids_;
};

}  // namespace

std::optional<SchemaProblem> find_schema_problem(const nlohmann::ordered_json& schema, const std::string& at) {
  try {
    Checker(schema, at).run();
  } catch (Found& f) {
    return std::move(f.problem);
  }
  return std::nullopt;
}

}  // namespace lathe::grammar
