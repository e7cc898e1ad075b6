// Validates an OpenAI chat-completions body and turns it into a ChatRequest: messages normalised for chat
// templates (developer → system, text parts joined, tool-call arguments parsed to objects), tools honouring
// tool_choice "none", and enable_thinking resolved from chat_template_kwargs, then reasoning_effort.
#pragma once
#include <nlohmann/json.hpp>

#include "server/generation_flow.h"

namespace lathe::server {

ChatRequest parse_openai_chat(const nlohmann::ordered_json& body, const ServerDefaults& defaults);
// The same, taking the messages and tools out of `body` rather than copying them (the other fields stay).
ChatRequest take_openai_chat(nlohmann::ordered_json& body, const ServerDefaults& defaults);

// Shared with the Anthropic translation: checks an OpenAI-shaped tools array (400 naming the entry), each
// function's parameters with check_tool_schema.
void check_tools(const nlohmann::ordered_json& tools, const char* field);

// A 400 when `schema` (the parameters of the tool named `tool`, at request field `field`) is not a well-formed
// JSON Schema object (chat/grammar/schema_check.h): "Invalid schema for <noun> '<tool>': <path>: <why>", as
// OpenAI words it, with param `field` and code invalid_function_parameters.
void check_tool_schema(const nlohmann::ordered_json& schema, const std::string& tool, const std::string& field,
                       const char* noun);

// The text of one content part of a chat or Responses message (text, input_text, output_text, refusal); a 400
// naming `at` for media the model does not take and for a type it does not know.
std::string content_part_text(const nlohmann::ordered_json& part, const std::string& at);

}  // namespace lathe::server
