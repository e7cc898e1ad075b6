// chat/grammar/schema_check.h: real-world tool schemas (OpenAI's examples, pydantic, zod, OpenAPI, recursive
// $defs) pass; each malformed keyword is found at its path; hostile nesting and many refs stay bounded.
#include <gtest/gtest.h>

#include <chrono>

#include "chat/grammar/schema_check.h"
#include "common/limits.h"

namespace lathe::grammar {
namespace {

using ojson = nlohmann::ordered_json;

// "path: why" of the first problem, or "" for a well-formed schema.
std::string schema_problem_text(const ojson& schema) {
  auto p = find_schema_problem(schema, "params");
  return p ? p->path + ": " + p->why : "";
}

std::string schema_problem_path(const std::string& text) {
  auto p = find_schema_problem(ojson::parse(text), "params");
  return p ? p->path : "";
}

// prefix + i (appended, not `"p" + std::to_string(i)`, which GCC 12 warns about with -Wrestrict).
std::string schema_check_name(const char* prefix, int i) {
  std::string s = prefix;
  s += std::to_string(i);
  return s;
}

TEST(ToolSchemaCheck, RealWorldSchemasPass) {
  const char* good[] = {
      // OpenAI's function-calling example, strict.
      R"({"type": "object", "properties": {"location": {"type": "string", "description": "City"},
          "unit": {"type": ["string", "null"], "enum": ["celsius", "fahrenheit", null]}},
          "required": ["location", "unit"], "additionalProperties": false})",
      // pydantic v2: $defs, $ref, anyOf with null, defaults, titles.
      R"({"$defs": {"Address": {"properties": {"street": {"title": "Street", "type": "string"}},
          "required": ["street"], "title": "Address", "type": "object"}},
          "properties": {"address": {"$ref": "#/$defs/Address"},
          "tags": {"default": [], "items": {"type": "string"}, "title": "Tags", "type": "array"},
          "nick": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": null, "title": "Nick"}},
          "required": ["address"], "title": "Person", "type": "object"})",
      // zod-to-json-schema: draft-07 definitions.
      R"({"type": "object", "properties": {"a": {"$ref": "#/definitions/A"}}, "required": [],
          "additionalProperties": false, "definitions": {"A": {"type": "integer", "exclusiveMinimum": 0}},
          "$schema": "http://json-schema.org/draft-07/schema#"})",
      // Recursive through $defs, and a ref to the root.
      R"({"$defs": {"node": {"type": "object", "properties": {"children": {"type": "array",
          "items": {"$ref": "#/$defs/node"}}, "parent": {"$ref": "#"}}}}, "$ref": "#/$defs/node"})",
      // OpenAPI 3.0 and draft 4 spellings.
      R"({"type": "object", "properties": {"n": {"type": "number", "minimum": 0, "exclusiveMinimum": true,
          "nullable": true, "example": 3}}})",
      // The rest of the vocabulary.
      R"({"type": "object", "properties": {
          "c": {"const": {"x": [1, 2]}}, "o": {"oneOf": [{"type": "string", "format": "email"}, {"type": "integer",
          "multipleOf": 2.5}]}, "all": {"allOf": [{"minProperties": 1}, {"maxProperties": 3.0}]},
          "n": {"not": {"type": "null"}}, "i": {"if": {"minLength": 1}, "then": {"pattern": "^[a-z]+$"},
          "else": false}, "p": {"patternProperties": {"^x-": true}, "propertyNames": {"maxLength": 8}},
          "t": {"prefixItems": [{"type": "string"}], "items": false, "contains": {"type": "string"},
          "minContains": 1, "uniqueItems": true}, "tuple": {"items": [{"type": "string"}, {}],
          "additionalItems": false}, "d": {"dependentRequired": {"a": ["b"]}, "dependentSchemas": {"a": {}},
          "dependencies": {"x": ["y"], "z": {"required": ["w"]}}},
          "anchored": {"$ref": "#addr"}, "byid": {"$ref": "urn:example:thing#/properties/v"},
          "slash": {"$ref": "#/$defs/a~1b"}, "space": {"$ref": "#/$defs/my%20type"}, "first": {"$ref":
          "#/$defs/list/items/0"}},
          "$defs": {"addr": {"$anchor": "addr", "type": "string"}, "a/b": true, "my type": {"type": "boolean"},
          "list": {"items": [{"type": "string"}]}, "thing": {"$id": "urn:example:thing", "properties":
          {"v": {"type": "integer"}}}},
          "x-vendor": {"type": 5}, "description": 7, "examples": "anything"})",
      "{}",
  };
  for (const char* text : good) EXPECT_EQ(schema_problem_text(ojson::parse(text)), "") << text;
  EXPECT_EQ(schema_problem_text(true), "");
}

TEST(ToolSchemaCheck, EachMalformedKeywordIsFoundAtItsPath) {
  const std::pair<const char*, const char*> bad[] = {
      {R"({"properties": {"a": {"type": "str"}}})", "params.properties.a.type"},
      {R"({"type": 5})", "params.type"},
      {R"({"type": []})", "params.type"},
      {R"({"type": ["string", 5]})", "params.type[1]"},
      {R"({"type": ["string", "string"]})", "params.type[1]"},
      {R"({"properties": []})", "params.properties"},
      {R"({"properties": {"a": "string"}})", "params.properties.a"},
      {R"({"required": "a"})", "params.required"},
      {R"({"required": ["a", 1]})", "params.required[1]"},
      {R"({"items": 5})", "params.items"},
      {R"({"anyOf": []})", "params.anyOf"},
      {R"({"oneOf": {}})", "params.oneOf"},
      {R"({"allOf": [{}, 5]})", "params.allOf[1]"},
      {R"({"enum": "a"})", "params.enum"},
      {R"({"minLength": -1})", "params.minLength"},
      {R"({"maxItems": 1.5})", "params.maxItems"},
      {R"({"minimum": "0"})", "params.minimum"},
      {R"({"multipleOf": 0})", "params.multipleOf"},
      {R"({"pattern": 5})", "params.pattern"},
      {R"({"additionalProperties": "no"})", "params.additionalProperties"},
      {R"({"$defs": {"a": 1}})", "params.$defs.a"},
      {R"({"dependentRequired": {"a": "b"}})", "params.dependentRequired.a"},
      {R"({"properties": {"a": {"items": {"anyOf": [{}, {"properties": {"b": {"type": {}}}}]}}}})",
       "params.properties.a.items.anyOf[1].properties.b.type"},
      // $refs that cannot resolve, and what they point at.
      {R"({"properties": {"a": {"$ref": "#/$defs/missing"}}, "$defs": {}})", "params.properties.a.$ref"},
      {R"({"$ref": "https://example.com/schema.json"})", "params.$ref"},
      {R"({"$ref": 5})", "params.$ref"},
      {R"({"required": [], "$ref": "#/required"})", "params.$ref"},
      {R"({"$ref": "#nowhere"})", "params.$ref"},
      {R"({"$ref": "#/$defs/~2"})", "params.$ref"},
      {R"({"$ref": "#/$defs/a%zz"})", "params.$ref"},
      {R"({"$ref": "#/$defs/list/items/01", "$defs": {"list": {"items": [{}, {}]}}})", "params.$ref"},
      // A target outside any schema position is checked as a schema when a $ref uses it.
      {R"({"$ref": "#/x-stash/s", "x-stash": {"s": {"type": 7}}})", "params.x-stash.s.type"},
  };
  for (const auto& [text, path] : bad) EXPECT_EQ(schema_problem_path(text), path) << text;
  // The message says what is wrong.
  EXPECT_EQ(schema_problem_text(ojson::parse(R"({"properties": {"a": {"type": "str"}}})")),
            "params.properties.a.type: type \"str\" is not a JSON-Schema type (one of string, number, integer, "
            "boolean, object, array, null)");
  EXPECT_NE(schema_problem_text(ojson::parse(R"({"$ref": "#/$defs/missing", "$defs": {}})")).find("missing"),
            std::string::npos);
  EXPECT_EQ(schema_problem_text(5), "params: a schema must be an object or a boolean, not a number");
}

TEST(ToolSchemaCheck, HostileInputStaysBounded) {
  // Nesting past the request parser's depth limit (built in memory, so no parser stopped it): a problem, not a
  // stack overflow.
  ojson deep;
  ojson* leaf = &deep;
  for (int i = 0; i < 100000; ++i) leaf = &(*leaf)["items"];
  *leaf = {{"type", "string"}};
  auto p = find_schema_problem(deep, "params");
  ASSERT_TRUE(p);
  EXPECT_NE(p->why.find(std::to_string(limits::kJsonMaxDepth)), std::string::npos) << p->why;
  // The same target behind many refs, at every level of a chain of $defs: each node is checked once.
  ojson defs = ojson::object();
  for (int i = 0; i < 100; ++i)
    defs[schema_check_name("d", i)] = {{"type", "object"},
                                       {"properties", {{"next", {{"$ref", schema_check_name("#/$defs/d", i + 1)}}}}}};
  defs["d100"] = {{"type", "string"}};
  ojson many = {{"$defs", defs}, {"properties", ojson::object()}};
  for (int i = 0; i < 20000; ++i) many["properties"][schema_check_name("p", i)] = {{"$ref", "#/$defs/d0"}};
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(find_schema_problem(many, "params"));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  // A long key is cut in the message.
  const std::string key(100000, 'k');
  p = find_schema_problem(ojson{{"properties", {{key, 5}}}}, "params");
  ASSERT_TRUE(p);
  EXPECT_LT(p->path.size(), 200u);
}

}  // namespace
}  // namespace lathe::grammar
