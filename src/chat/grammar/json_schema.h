// JSON schema → GBNF (parse_gbnf then compiles it), so that generated text always parses as JSON matching the
// schema. Supported: type (one or a list), enum, const, anyOf/oneOf, allOf of objects, $ref into the same
// document (#, #/$defs/…, #/definitions/…, recursive), properties/required (properties in schema order;
// additionalProperties: only the listed ones, or a map when there are no properties), items, prefixItems,
// minItems/maxItems, minLength/maxLength, format date/time/date-time/uuid, nullable, and minimum 0 (non-negative)
// or bounds no tighter than ±(2^53-1). Annotations (title, description, default, examples, …) are ignored. Any
// other keyword (pattern, multipleOf, …) throws Error(InvalidArgument) naming it and where it is.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace lathe::grammar {

// Builds one grammar from several schemas (a tool call names one of several tools).
class JsonSchemaGrammar {
 public:
  JsonSchemaGrammar();
  // Adds the rules for `schema` and returns the name of the rule that matches one value of it. $refs resolve
  // against `schema` itself. `at` names the schema in error messages (e.g. "response_format.json_schema").
  std::string add(const nlohmann::ordered_json& schema, const std::string& at);
  // Adds `name ::= body` (GBNF) verbatim.
  void add_rule(const std::string& name, const std::string& body);
  // The grammar text, with `root ::= <root_body>`.
  std::string gbnf(const std::string& root_body) const;

 private:
  struct Ctx;
  std::string visit(const nlohmann::ordered_json& s, Ctx& c, const std::string& path, int depth);
  // visit() for a value its parent's rule reaches only after reading a token.
  std::string visit_after_token(const nlohmann::ordered_json& s, Ctx& c, const std::string& path, int depth);
  std::string object_rule(const nlohmann::ordered_json& s, Ctx& c, const std::string& path, int depth);
  std::string array_rule(const nlohmann::ordered_json& s, Ctx& c, const std::string& path, int depth);
  std::string string_rule(const nlohmann::ordered_json& s, const std::string& path);
  std::string number_rule(const nlohmann::ordered_json& s, const std::string& path, bool integer);
  std::string fresh(const std::string& hint);
  std::string rules_;
  int counter_ = 0;
};

// A GBNF literal that matches `text` exactly (quoted and escaped).
std::string gbnf_literal(const std::string& text);

// GBNF for the whole of one JSON value of `schema` (what response_format json_schema compiles to).
std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema, const std::string& at);
// GBNF for any JSON object (response_format json_object).
std::string json_object_gbnf();

}  // namespace lathe::grammar
