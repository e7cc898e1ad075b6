// Translates an Anthropic Messages body into a ChatRequest: system (string or text blocks) becomes a leading
// system message; text blocks join with newlines; tool_use becomes assistant tool_calls and tool_result a tool
// message; thinking blocks are dropped (templates re-derive them); tools with input_schema become functions.
#pragma once
#include <nlohmann/json.hpp>

#include "server/generation_flow.h"

namespace lathe::server {

ChatRequest parse_anthropic_messages(const nlohmann::ordered_json& body, const ServerDefaults& defaults);
// The same, moving the messages' text out of `body` rather than copying it (the other fields stay).
ChatRequest take_anthropic_messages(nlohmann::ordered_json& body, const ServerDefaults& defaults);

}  // namespace lathe::server
