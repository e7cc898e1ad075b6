// Routes decoded generation text to the channels a client sees: reasoning (inside <think>) and content, with
// content held back once tool-call markup starts. At the end it parses tool calls from the full content; if that
// fails the markup stays in content, so nothing the model wrote is lost.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/reasoning_splitter.h"
#include "chat/tool_calls.h"

namespace lathe::server {

struct OutputDelta {
  std::string reasoning;
  std::string content;
  nlohmann::ordered_json logprobs;  // streamed OpenAI logprobs entries of the tokens behind this content (or null)
  bool empty() const { return reasoning.empty() && content.empty(); }
};

struct FinalOutput {
  std::string content;  // all content (tool markup removed when calls were parsed)
  std::string reasoning;
  std::vector<ToolCall> tool_calls;
};

class OutputRouter {
 public:
  // think_tags: split <think> blocks off into reasoning. tools: the request's active tools (null/empty: none).
  OutputRouter(bool think_tags, bool start_in_reasoning, nlohmann::ordered_json tools);

  OutputDelta push(std::string_view text);
  // End of generation: the held-back text, including content that was gated for tool parsing but turned out
  // not to be a valid call.
  OutputDelta finish();
  const FinalOutput& result() const { return final_; }

 private:
  OutputDelta route(ReasoningDelta d);

  bool think_tags_;
  bool tools_active_;
  nlohmann::ordered_json tools_;
  ReasoningSplitter splitter_;
  ToolMarkupGate gate_;
  std::string content_all_;
  size_t content_emitted_ = 0;
  FinalOutput final_;
};

}  // namespace lathe::server
