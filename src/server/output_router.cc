#include "server/output_router.h"

namespace lathe::server {

OutputRouter::OutputRouter(bool think_tags, bool start_in_reasoning, nlohmann::json tools)
    : think_tags_(think_tags),
      tools_active_(tools.is_array() && !tools.empty()),
      tools_(std::move(tools)),
      splitter_(think_tags && start_in_reasoning) {}

OutputDelta OutputRouter::route(ReasoningDelta d) {
  OutputDelta out;
  out.reasoning = std::move(d.reasoning);
  final_.reasoning += out.reasoning;
  content_all_ += d.content;
  out.content = tools_active_ ? gate_.push(d.content) : std::move(d.content);
  content_emitted_ += out.content.size();
  return out;
}

OutputDelta OutputRouter::push(std::string_view text) {
  if (!think_tags_) return route(ReasoningDelta{{}, std::string(text)});
  return route(splitter_.push(text));
}

OutputDelta OutputRouter::finish() {
  OutputDelta out = think_tags_ ? route(splitter_.flush()) : OutputDelta{};
  if (tools_active_) {
    gate_.flush();  // its tail is part of content_all_, released below if no call parses
    ParsedOutput parsed = parse_tool_calls(content_all_, tools_);
    if (!parsed.calls.empty()) {
      final_.content = std::move(parsed.content);
      final_.tool_calls = std::move(parsed.calls);
      return out;
    }
  }
  // No calls: whatever the gate held back is plain content after all.
  std::string rest = content_all_.size() > content_emitted_ ? content_all_.substr(content_emitted_) : std::string();
  out.content += rest;
  content_emitted_ = content_all_.size();
  final_.content = content_all_;
  return out;
}

}  // namespace lathe::server
