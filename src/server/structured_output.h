// Turns a request's StructuredOutput (response_format, json_schema, grammar, a forced tool call) into the
// grammar constraint its sampler applies each step. Schemas and grammars that cannot be compiled are the
// client's error: 400 naming the field and the keyword.
#pragma once
#include "server/generation_flow.h"

namespace lathe::server {

// Sets prepared.settings.sampling.constraint from prepared.settings.structured (nothing for Kind::None).
// A prompt that ends inside <think> gets its grammar from after </think>.
void attach_structured_output(ServerContext& ctx, PreparedGeneration& prepared);

// The GBNF for one call, in the chat template's tool-call markup, of the named tool (or any of `tools`).
std::string tool_call_gbnf(const nlohmann::ordered_json& tools, const std::string& name);

}  // namespace lathe::server
