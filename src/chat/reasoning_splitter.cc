#include "chat/reasoning_splitter.h"

#include <array>

#include "chat/text_markers.h"

namespace lathe {
namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";
constexpr std::array<std::string_view, 2> kTags = {kOpen, kClose};

}  // namespace

ReasoningSplitter::ReasoningSplitter(bool start_in_reasoning) : in_reasoning_(start_in_reasoning) {}

void ReasoningSplitter::emit(std::string_view text, ReasoningDelta& out) {
  if (in_reasoning_) {
    out.reasoning.append(text);
    return;
  }
  // Qwen writes "</think>\n\n" before the answer. mlx_lm.server passes those newlines on as content; we drop
  // the whitespace that directly follows a </think> instead (Qwen's own template likewise lstrips the answer
  // when it re-renders a turn), so clients don't get an answer that starts with blank lines.
  if (strip_leading_space_) {
    const size_t first = text.find_first_not_of(" \t\r\n");
    if (first == std::string_view::npos) return;
    text.remove_prefix(first);
    strip_leading_space_ = false;
  }
  out.content.append(text);
}

ReasoningDelta ReasoningSplitter::push(std::string_view text) {
  ReasoningDelta out;
  held_.append(text);
  std::string_view rest = held_;
  // Both tags are mode switches wherever they appear: a repeated <think> inside reasoning or a stray </think>
  // in content is markup, never text for the client.
  for (;;) {
    size_t at = std::string_view::npos;
    std::string_view tag;
    for (std::string_view t : kTags) {
      const size_t p = rest.find(t);
      if (p < at) {
        at = p;
        tag = t;
      }
    }
    if (at == std::string_view::npos) break;
    emit(rest.substr(0, at), out);
    in_reasoning_ = tag == kOpen;
    if (!in_reasoning_) strip_leading_space_ = true;
    rest.remove_prefix(at + tag.size());
  }
  const size_t keep = partial_marker_length(rest, {kOpen, kClose});
  emit(rest.substr(0, rest.size() - keep), out);
  held_ = std::string(rest.substr(rest.size() - keep));
  return out;
}

ReasoningDelta ReasoningSplitter::flush() {
  ReasoningDelta out;
  // A held tail that never became a tag is ordinary text on the current channel; an unterminated <think>
  // block therefore ends up in reasoning.
  emit(held_, out);
  held_.clear();
  return out;
}

bool prompt_ends_inside_think(std::string_view prompt_text) {
  const size_t open = prompt_text.rfind(kOpen);
  if (open == std::string_view::npos) return false;
  const size_t close = prompt_text.rfind(kClose);
  return close == std::string_view::npos || open > close;
}

bool template_uses_think_tags(std::string_view template_source) {
  return template_source.find("enable_thinking") != std::string_view::npos &&
         template_source.find(kOpen) != std::string_view::npos;
}

}  // namespace lathe
