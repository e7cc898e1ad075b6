#include "chat/grammar/json_schema.h"

#include <cmath>
#include <map>
#include <set>

#include "chat/grammar/number_range.h"
#include "chat/grammar/regex_pattern.h"
#include "common/error.h"

namespace lathe::grammar {
namespace {

using ojson = nlohmann::ordered_json;

constexpr int kMaxDepth = 64;
constexpr int64_t kMaxLength = 1000;  // largest minLength/maxLength/minItems/maxItems we expand
constexpr double kSafeInt = 9007199254740991.0;

// JSON-value primitives. Whitespace is at most one space: models given room pad with newlines and indents
// (seen: 17 tokens of it per member), spending the token budget on nothing.
constexpr const char* kPrimitives = R"(ws ::= " "?
json-char ::= [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )
json-string ::= "\"" json-char* "\""
json-int ::= "-"? ( "0" | [1-9] [0-9]{0,15} )
json-uint ::= "0" | [1-9] [0-9]{0,15}
json-frac ::= ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?
json-number ::= json-int json-frac
json-unumber ::= json-uint json-frac
json-boolean ::= "true" | "false"
json-null ::= "null"
json-value ::= json-object | json-array | json-string | json-number | json-boolean | json-null
json-object ::= "{" ws ( json-string ws ":" ws json-value ws ( "," ws json-string ws ":" ws json-value ws )* )? "}"
json-array ::= "[" ws ( json-value ws ( "," ws json-value ws )* )? "]"
json-date ::= [0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [12] [0-9] | "3" [01] )
json-time ::= ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,6} )? ( "Z" | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )
json-hex ::= [0-9a-fA-F]
json-uuid ::= json-hex{8} "-" json-hex{4} "-" json-hex{4} "-" json-hex{4} "-" json-hex{12}
json-label ::= [A-Za-z0-9] ( [A-Za-z0-9-]{0,61} [A-Za-z0-9] )?
json-hostname ::= json-label ( "." json-label )*
json-email ::= [A-Za-z0-9_%+-]+ ( "." [A-Za-z0-9_%+-]+ )* "@" ( json-label "." )+ [A-Za-z]{2,24}
json-octet ::= "25" [0-5] | "2" [0-4] [0-9] | "1" [0-9] [0-9] | [1-9] [0-9] | [0-9]
json-ipv4 ::= json-octet "." json-octet "." json-octet "." json-octet
json-uri ::= [A-Za-z] [A-Za-z0-9+.-]* ":" ( [A-Za-z0-9._~:/?#\[\]@!$&'()*+,;=-] | "%" json-hex json-hex )+
)";

const std::set<std::string>& annotations() {
  static const std::set<std::string> k = {"title", "description", "default",    "examples",     "$schema",
                                          "$id",   "$comment",    "deprecated", "readOnly",     "writeOnly",
                                          "$defs", "definitions", "strict",     "discriminator"};
  return k;
}

[[noreturn]] void unsupported(const std::string& keyword, const std::string& path, const std::string& why = "") {
  throw Error(ErrorKind::InvalidArgument, path + ": the JSON-schema keyword \"" + keyword + "\" is not supported" +
                                              (why.empty() ? "" : " (" + why + ")"));
}
[[noreturn]] void invalid(const std::string& path, const std::string& why) {
  throw Error(ErrorKind::InvalidArgument, path + ": " + why);
}

int64_t count_of(const ojson& s, const char* key, int64_t fallback, const std::string& path) {
  auto it = s.find(key);
  if (it == s.end()) return fallback;
  if (!it->is_number_integer() || it->get<int64_t>() < 0)
    invalid(path + "." + key, std::string(key) + " must be a non-negative integer");
  if (it->get<int64_t>() > kMaxLength)
    unsupported(key, path, "values above " + std::to_string(kMaxLength) + " are not enforced");
  return it->get<int64_t>();
}

// `unit{min,max}` as GBNF (max < 0: unbounded).
std::string repeat(const std::string& unit, int64_t min, int64_t max) {
  if (max < 0) return min == 0 ? unit + "*" : min == 1 ? unit + "+" : unit + "{" + std::to_string(min) + ",}";
  return unit + "{" + std::to_string(min) + "," + std::to_string(max) + "}";
}

}  // namespace

std::string gbnf_literal(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20) {
      static const char* hex = "0123456789ABCDEF";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

struct JsonSchemaGrammar::Ctx {
  const ojson* root;
  std::string prefix;
  std::map<std::string, std::string> refs;  // "$ref" → its rule
  // $refs whose schema is being visited with nothing read yet since it began: meeting one again there is a
  // cycle that reads nothing (left recursion), which no value can end.
  std::set<std::string> left_open;
};

JsonSchemaGrammar::JsonSchemaGrammar() : rules_(kPrimitives) {}

std::string JsonSchemaGrammar::fresh(const std::string& hint) {
  std::string name;
  for (char ch : hint) name += (std::isalnum(static_cast<unsigned char>(ch)) != 0) ? ch : '-';
  if (name.size() > 40) name.resize(40);
  // Appended in place (GCC 12 reports a false -Wrestrict for the chain of operator+ here in some unity batches).
  std::string rule = "s";
  rule += std::to_string(counter_++);
  rule += '-';
  rule += name;
  return rule;
}

void JsonSchemaGrammar::add_rule(const std::string& name, const std::string& body) {
  rules_ += name + " ::= " + body + "\n";
}

std::string JsonSchemaGrammar::add(const ojson& schema, const std::string& at) {
  Ctx c{&schema, at, {}, {}};
  return visit(schema, c, at, 0);
}

std::string JsonSchemaGrammar::gbnf(const std::string& root_body) const {
  return "root ::= " + root_body + "\n" + rules_;
}

std::string JsonSchemaGrammar::visit_after_token(const ojson& s, Ctx& c, const std::string& path, int depth) {
  std::set<std::string> open;
  open.swap(c.left_open);  // the caller's rule has read "{", "[" or a key by the time this value starts
  std::string rule = visit(s, c, path, depth);
  open.swap(c.left_open);
  return rule;
}

std::string JsonSchemaGrammar::visit(const ojson& s, Ctx& c, const std::string& path, int depth) {
  if (depth > kMaxDepth) invalid(path, "the schema nests deeper than " + std::to_string(kMaxDepth));
  if (s.is_boolean()) {
    if (!s.get<bool>()) invalid(path, "the schema false matches nothing");
    return "json-value";
  }
  if (!s.is_object()) invalid(path, "a schema must be an object or a boolean");

  static const std::set<std::string> known = {"type",
                                              "pattern",
                                              "enum",
                                              "const",
                                              "anyOf",
                                              "oneOf",
                                              "allOf",
                                              "$ref",
                                              "properties",
                                              "required",
                                              "items",
                                              "prefixItems",
                                              "minItems",
                                              "maxItems",
                                              "minLength",
                                              "maxLength",
                                              "format",
                                              "nullable",
                                              "minimum",
                                              "maximum",
                                              "additionalProperties",
                                              "exclusiveMinimum",
                                              "exclusiveMaximum"};
  for (const auto& [k, v] : s.items())
    if (!known.count(k) && !annotations().count(k)) unsupported(k, path);

  std::string body;
  if (auto r = s.find("$ref"); r != s.end()) {
    if (!r->is_string()) invalid(path + ".$ref", "$ref must be a string");
    const std::string ref = r->get<std::string>();
    auto known_ref = c.refs.find(ref);
    if (known_ref != c.refs.end()) {
      if (c.left_open.count(ref))
        invalid(path + ".$ref", "$ref " + ref + " leads back to itself before any value is read, so no value matches");
      body = known_ref->second;
    } else {
      if (ref.empty() || ref[0] != '#') unsupported("$ref", path, "only references into the same schema (#…)");
      const ojson* target = c.root;
      try {
        target = &c.root->at(ojson::json_pointer(ref.substr(1)));
      } catch (const std::exception&) {
        invalid(path + ".$ref", "$ref " + ref + " points at nothing");
      }
      const std::string name = fresh("ref-" + ref);
      c.refs[ref] = name;  // before visiting: recursive schemas refer back to this rule
      c.left_open.insert(ref);
      add_rule(name, visit(*target, c, path + ".$ref", depth + 1));
      c.left_open.erase(ref);
      body = name;
    }
  } else if (auto e = s.find("const"); e != s.end()) {
    body = gbnf_literal(e->dump());
  } else if (auto en = s.find("enum"); en != s.end()) {
    if (!en->is_array() || en->empty()) invalid(path + ".enum", "enum must be a non-empty array");
    for (const auto& v : *en) body += (body.empty() ? "" : " | ") + gbnf_literal(v.dump());
    body = "( " + body + " )";
  } else if (s.contains("anyOf") || s.contains("oneOf")) {
    const ojson& alts = s.contains("anyOf") ? s["anyOf"] : s["oneOf"];
    const std::string key = s.contains("anyOf") ? "anyOf" : "oneOf";
    if (!alts.is_array() || alts.empty()) invalid(path + "." + key, key + " must be a non-empty array");
    for (size_t i = 0; i < alts.size(); ++i)
      body += (i ? " | " : "") + visit(alts[i], c, path + "." + key + "[" + std::to_string(i) + "]", depth + 1);
    body = "( " + body + " )";
  } else if (auto all = s.find("allOf"); all != s.end()) {
    if (!all->is_array() || all->empty()) invalid(path + ".allOf", "allOf must be a non-empty array");
    if (all->size() == 1) {
      body = visit((*all)[0], c, path + ".allOf[0]", depth + 1);
    } else {
      // Objects merge: the union of properties and of required names.
      ojson merged = {{"type", "object"}, {"properties", ojson::object()}, {"required", ojson::array()}};
      for (size_t i = 0; i < all->size(); ++i) {
        const ojson& part = (*all)[i];
        if (!part.is_object() || !part.contains("properties") || part.contains("$ref"))
          unsupported("allOf", path, "only objects with properties are merged");
        for (const auto& [k, v] : part["properties"].items()) merged["properties"][k] = v;
        if (part.contains("required"))
          for (const auto& r : part["required"]) merged["required"].push_back(r);
      }
      body = object_rule(merged, c, path, depth + 1);
    }
  } else {
    std::vector<std::string> types;
    if (auto t = s.find("type"); t != s.end()) {
      if (t->is_string()) {
        types.push_back(t->get<std::string>());
      } else if (t->is_array() && !t->empty()) {
        for (const auto& x : *t) {
          if (!x.is_string()) invalid(path + ".type", "type must be a string or an array of strings");
          types.push_back(x.get<std::string>());
        }
      } else {
        invalid(path + ".type", "type must be a string or an array of strings");
      }
    } else if (s.contains("properties")) {
      types.push_back("object");
    } else if (s.contains("items") || s.contains("prefixItems")) {
      types.push_back("array");
    }
    if (types.empty()) {
      if (s.contains("minLength") || s.contains("maxLength") || s.contains("format") || s.contains("pattern"))
        types.push_back("string");
      else
        return "json-value";
    }
    for (const std::string& t : types) {
      std::string one;
      if (t == "string")
        one = string_rule(s, path);
      else if (t == "integer")
        one = number_rule(s, path, true);
      else if (t == "number")
        one = number_rule(s, path, false);
      else if (t == "boolean")
        one = "json-boolean";
      else if (t == "null")
        one = "json-null";
      else if (t == "object")
        one = object_rule(s, c, path, depth);
      else if (t == "array")
        one = array_rule(s, c, path, depth);
      else
        invalid(path + ".type", "unknown type \"" + t + "\"");
      body += (body.empty() ? "" : " | ") + one;
    }
    if (types.size() > 1) body = "( " + body + " )";
  }
  if (auto n = s.find("nullable"); n != s.end() && n->is_boolean() && n->get<bool>())
    body = "( " + body + " | json-null )";
  return body;
}

std::string JsonSchemaGrammar::string_rule(const ojson& s, const std::string& path) {
  if (auto p = s.find("pattern"); p != s.end()) {
    if (!p->is_string()) invalid(path + ".pattern", "pattern must be a string");
    if (s.contains("format") || s.contains("minLength") || s.contains("maxLength"))
      unsupported("pattern", path, "together with format, minLength or maxLength");
    try {
      return "\"\\\"\" " + pattern_gbnf(p->get<std::string>()) + " \"\\\"\"";
    } catch (const Error& e) {
      invalid(path + ".pattern", e.what());
    }
  }
  if (auto f = s.find("format"); f != s.end()) {
    if (!f->is_string()) invalid(path + ".format", "format must be a string");
    const std::string fmt = f->get<std::string>();
    if (fmt == "date") return "\"\\\"\" json-date \"\\\"\"";
    if (fmt == "time") return "\"\\\"\" json-time \"\\\"\"";
    if (fmt == "date-time") return "\"\\\"\" json-date \"T\" json-time \"\\\"\"";
    if (fmt == "uuid") return "\"\\\"\" json-uuid \"\\\"\"";
    // A subset of each (what a model should write), not every spelling the RFCs allow.
    for (const char* f : {"email", "hostname", "ipv4", "uri"})
      if (fmt == f) return "\"\\\"\" json-" + fmt + " \"\\\"\"";
    unsupported("format", path,
                "format \"" + fmt + "\"; supported: date, time, date-time, uuid, email, hostname, ipv4, uri");
  }
  const int64_t min = count_of(s, "minLength", 0, path);
  const int64_t max = count_of(s, "maxLength", -1, path);
  if (max >= 0 && max < min) invalid(path, "maxLength is below minLength");
  if (min == 0 && max < 0) return "json-string";
  return "\"\\\"\" " + repeat("json-char", min, max) + " \"\\\"\"";
}

std::string JsonSchemaGrammar::number_rule(const ojson& s, const std::string& path, bool integer) {
  // minimum / maximum / exclusiveMinimum / exclusiveMaximum (a number, or draft 4's boolean beside minimum and
  // maximum) become integral bounds; the tighter one wins where both ends are given twice.
  NumberBounds b;
  auto bound = [&](const char* key, bool lower, bool exclusive) {
    auto m = s.find(key);
    if (m == s.end() || m->is_boolean()) return;
    if (!m->is_number()) invalid(path + "." + key, std::string(key) + " must be a number");
    const double d = m->get<double>();
    // As loose as the JSON primitives (16 digits) or looser: no bound (zod's safe-integer range).
    if (lower ? d <= -kSafeInt : d >= kSafeInt) return;
    if (std::fabs(d) > 9999999999999999.0) unsupported(key, path, "bounds past 16 digits are not enforced");
    int64_t v;
    bool open = false;
    if (integer) {  // the nearest integer inside the bound
      v = static_cast<int64_t>(lower ? (exclusive ? std::floor(d) + 1 : std::ceil(d))
                                     : (exclusive ? std::ceil(d) - 1 : std::floor(d)));
    } else {
      if (d != std::floor(d)) unsupported(key, path, "a bound with a fraction is enforced on integers only");
      v = static_cast<int64_t>(d);
      open = exclusive;
    }
    std::optional<int64_t>& end = lower ? b.lo : b.hi;
    bool& end_open = lower ? b.lo_open : b.hi_open;
    const bool tighter = !end || (lower ? v > *end : v < *end) || (v == *end && open);
    if (tighter) {
      end = v;
      end_open = open;
    }
  };
  auto draft4 = [&](const char* key) {
    auto e = s.find(key);
    if (e != s.end() && !e->is_boolean() && !e->is_number())
      invalid(path + "." + key, std::string(key) + " must be a number");
    return e != s.end() && e->is_boolean() && e->get<bool>();
  };
  bound("minimum", true, draft4("exclusiveMinimum"));
  bound("maximum", false, draft4("exclusiveMaximum"));
  bound("exclusiveMinimum", true, true);
  bound("exclusiveMaximum", false, true);
  if (!b.lo && !b.hi) return integer ? "json-int" : "json-number";
  try {
    return number_range_gbnf(b, integer);
  } catch (const Error&) {
    invalid(path, "no " + std::string(integer ? "integer" : "number") + " lies within its minimum and maximum");
  }
}

std::string JsonSchemaGrammar::object_rule(const ojson& s, Ctx& c, const std::string& path, int depth) {
  const ojson* props = nullptr;
  if (auto p = s.find("properties"); p != s.end()) {
    if (!p->is_object()) invalid(path + ".properties", "properties must be an object");
    props = &*p;
  }
  std::set<std::string> required;
  if (auto r = s.find("required"); r != s.end()) {
    if (!r->is_array()) invalid(path + ".required", "required must be an array of names");
    for (const auto& n : *r) {
      if (!n.is_string()) invalid(path + ".required", "required must be an array of names");
      if (!props || !props->contains(n.get<std::string>()))
        invalid(path + ".required", "required names \"" + n.get<std::string>() + "\", which is not in properties");
      required.insert(n.get<std::string>());
    }
  }
  const auto extra = s.find("additionalProperties");
  if (!props || props->empty()) {
    if (extra != s.end() && extra->is_object()) {
      const std::string v = visit_after_token(*extra, c, path + ".additionalProperties", depth + 1);
      const std::string kv = "json-string ws \":\" ws " + v + " ws";
      return "( \"{\" ws ( " + kv + " ( \",\" ws " + kv + " )* )? \"}\" )";
    }
    if (extra != s.end() && extra->is_boolean() && !extra->get<bool>()) return "( \"{\" ws \"}\" )";
    return "json-object";
  }
  // Properties in schema order; optional ones may be skipped. tail(i, first): the members from i on, with a
  // comma before each one when something came before.
  std::vector<std::pair<std::string, std::string>> kv;  // rule for `"key": value`, required?
  std::vector<bool> req;
  for (const auto& [k, v] : props->items()) {
    const std::string value = visit_after_token(v, c, path + ".properties." + k, depth + 1);
    const std::string name = fresh("kv-" + k);
    add_rule(name, gbnf_literal(ojson(k).dump()) + " ws \":\" ws " + value + " ws");
    kv.emplace_back(name, k);
    req.push_back(required.count(k) > 0);
  }
  const size_t n = kv.size();
  std::vector<std::string> tail_first(n + 1), tail_more(n + 1);
  for (size_t i = n + 1; i-- > 0;) {
    if (i == n) {
      tail_first[i] = tail_more[i] = "";
      continue;
    }
    const std::string nf = fresh("tail"), nm = fresh("tail");
    const std::string first_taken = kv[i].first + " " + tail_more[i + 1];
    const std::string more_taken = "\",\" ws " + kv[i].first + " " + tail_more[i + 1];
    add_rule(nf, req[i] ? first_taken : "( " + first_taken + " ) | ( " + tail_first[i + 1] + " )");
    add_rule(nm, req[i] ? more_taken : "( " + more_taken + " ) | ( " + tail_more[i + 1] + " )");
    tail_first[i] = nf;
    tail_more[i] = nm;
  }
  return "( \"{\" ws " + tail_first[0] + " \"}\" )";
}

std::string JsonSchemaGrammar::array_rule(const ojson& s, Ctx& c, const std::string& path, int depth) {
  std::vector<std::string> prefix;
  if (auto p = s.find("prefixItems"); p != s.end()) {
    if (!p->is_array()) invalid(path + ".prefixItems", "prefixItems must be an array of schemas");
    for (size_t i = 0; i < p->size(); ++i)
      prefix.push_back(visit_after_token((*p)[i], c, path + ".prefixItems[" + std::to_string(i) + "]", depth + 1));
  }
  std::string item = "json-value";
  bool items_allowed = prefix.empty();
  if (auto it = s.find("items"); it != s.end()) {
    if (it->is_boolean() && !it->get<bool>()) {
      items_allowed = false;
    } else {
      item = visit_after_token(*it, c, path + ".items", depth + 1);
      items_allowed = true;
    }
  }
  if (!prefix.empty()) {
    std::string body = "\"[\" ws ";
    for (size_t i = 0; i < prefix.size(); ++i) body += (i ? "\",\" ws " : "") + prefix[i] + " ws ";
    if (items_allowed) body += "( \",\" ws " + item + " ws )* ";
    return "( " + body + "\"]\" )";
  }
  const int64_t min = count_of(s, "minItems", 0, path);
  const int64_t max = count_of(s, "maxItems", -1, path);
  if (max >= 0 && max < min) invalid(path, "maxItems is below minItems");
  if (max == 0) return "( \"[\" ws \"]\" )";
  const std::string el = fresh("item");
  add_rule(el, item + " ws");
  const std::string more = "( \",\" ws " + el + " )";
  const std::string rest = repeat(more, min > 0 ? min - 1 : 0, max < 0 ? -1 : max - 1);
  const std::string list = el + " " + rest;
  return min > 0 ? "( \"[\" ws " + list + " \"]\" )" : "( \"[\" ws ( " + list + " )? \"]\" )";
}

std::string json_schema_to_gbnf(const ojson& schema, const std::string& at) {
  JsonSchemaGrammar g;
  const std::string value = g.add(schema, at);
  return g.gbnf(value);
}

std::string json_object_gbnf() {
  JsonSchemaGrammar g;
  return g.gbnf("json-object");
}

}  // namespace lathe::grammar
