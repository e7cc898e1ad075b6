// The LLM-driven templates: self_instruct, style_transfer, multi_turn_chat, rag_qa, cot_synthesis,
// prompt_reconstruction and tool_use_traces, each a few chat completions per row against the served model
// (llm_client.h). A reply that comes back empty skips its row (counted); a failed call fails the job.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "lab/dataset/generated.h"
#include "lab/dataset/llm_client.h"
#include "lab/dataset/templates.h"

namespace lathe::dataset {

// One chat completion: messages in, the reply's text out (a test may stand in for the server).
using ChatFn = std::function<std::string(const json& messages)>;
// One chat completion offered tools: the reply's whole message (content, tool_calls); with require_call the
// model must call one (tool_choice "required").
using ToolChatFn = std::function<json(const json& messages, const json& tools, bool require_call)>;

// tool_use_traces' `tools` field: a JSON array of OpenAI function tools, each with a string name (throws
// InvalidArgument naming the field).
json parse_tools_field(const TemplateDef& t, const json& config);

// The rows the inputs promise (progress's total); throws InvalidArgument naming the field when the inputs give
// none or more than kMaxLlmRows.
int64_t llm_row_budget(const TemplateDef& t, const json& config);
constexpr int64_t kMaxLlmRows = 5000;

// tool_chat serves tool_use_traces (the other templates need only chat).
Generated run_llm_template(const TemplateDef& t, const json& config, const ChatFn& chat, const Progress& progress,
                           const ToolChatFn& tool_chat = {});

// Input helpers (exposed for tests): the non-blank lines, trimmed; the blank-line separated passages, trimmed.
std::vector<std::string> input_lines(const std::string& text);
std::vector<std::string> input_passages(const std::string& text);

}  // namespace lathe::dataset
