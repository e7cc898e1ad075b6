// Is a JSON document a well-formed JSON Schema? What a request's tool schemas must pass before they are accepted
// (tools[].function.parameters, Anthropic input_schema), whether or not a grammar is later compiled from them.
//
// It checks the shape of every keyword that gives a schema meaning, across drafts 4 to 2020-12 and OpenAPI's
// extras: a subschema is an object or a boolean; `type` is one of the seven JSON-Schema types or a non-empty
// array of them; `properties` / `$defs` / `definitions` / `patternProperties` / `dependentSchemas` map names to
// schemas; `items` is a schema (or, draft 4-7, an array of them); `anyOf` / `oneOf` / `allOf` / `prefixItems`
// are non-empty arrays of schemas; `not`, `if`/`then`/`else`, `additionalProperties`, `contains`, … are schemas;
// `required` is an array of strings; `enum` an array; the length and count bounds non-negative integers; the
// numeric bounds numbers (`exclusiveMinimum` also a boolean, as in draft 4); `pattern` and `format` strings;
// every `$ref` resolves inside the document (`#`, `#/json/pointer`, `#anchor`, or an `$id` it declares).
// Annotations (title, description, default, examples, …) and keywords it does not know are not checked: JSON
// Schema ignores unknown keywords, and so does this. Which keywords a grammar can enforce is json_schema.h's
// business, not this one's.
//
// Work is linear in the document: each node is checked once, a `$ref` target that is not itself in a schema
// position is checked once however many refs point at it, and nesting deeper than limits::kJsonMaxDepth is a
// problem rather than a deeper recursion.
#pragma once
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace lathe::grammar {

struct SchemaProblem {
  std::string path;  // where, starting with `at` (e.g. "tools[0].function.parameters.properties.city.type")
  std::string why;   // what is wrong there
};

// The first problem found in `schema` (named from `at`), or nothing when it is a well-formed schema.
std::optional<SchemaProblem> find_schema_problem(const nlohmann::ordered_json& schema, const std::string& at);

}  // namespace lathe::grammar
