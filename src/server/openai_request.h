// Validates an OpenAI chat-completions body and turns it into a ChatRequest: messages normalised for chat
// templates (developer → system, text parts joined, tool-call arguments parsed to objects), tools honouring
// tool_choice "none", and enable_thinking resolved from chat_template_kwargs, then reasoning_effort.
#pragma once
#include <nlohmann/json.hpp>

#include "server/generation_flow.h"

namespace lathe::server {

ChatRequest parse_openai_chat(const nlohmann::json& body, const ServerDefaults& defaults);

// Shared with the Anthropic translation: checks an OpenAI-shaped tools array (400 naming the entry).
nlohmann::json validate_tools(const nlohmann::json& tools, const char* field);

}  // namespace lathe::server
