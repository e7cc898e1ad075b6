// Splits decoded model text into reasoning and content on <think> / </think> tags, for think-tag models
// (Qwen3, Qwen3.5). Streaming-safe: a tail that could be the start of a tag is held back until it is resolved.
#pragma once
#include <string>
#include <string_view>

namespace lathe {

struct ReasoningDelta {
  std::string reasoning;
  std::string content;
};

class ReasoningSplitter {
 public:
  // start_in_reasoning: the rendered prompt ended inside an open <think> (see prompt_ends_inside_think).
  explicit ReasoningSplitter(bool start_in_reasoning = false);

  // Feeds newly decoded text; returns what can be emitted now on each channel.
  ReasoningDelta push(std::string_view text);
  // End of generation: releases held-back text (an unterminated <think> block flushes to reasoning).
  ReasoningDelta flush();
  bool in_reasoning() const { return in_reasoning_; }

 private:
  // Appends text to the channel of the current mode (content drops whitespace right after a </think>).
  void emit(std::string_view text, ReasoningDelta& out);

  bool in_reasoning_;
  bool strip_leading_space_ = false;  // content since the last </think> has been whitespace only
  std::string held_;                  // a tail that could be the start of a tag
};

// True when the last "<think>" in the prompt text comes after the last "</think>".
bool prompt_ends_inside_think(std::string_view prompt_text);
// True when a chat template can switch thinking on/off with <think> tags (mentions enable_thinking and <think>).
bool template_uses_think_tags(std::string_view template_source);

}  // namespace lathe
