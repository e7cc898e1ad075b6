#include "tokenizer/pattern.h"

#include "common/error.h"

namespace lathe {

Pattern::Pattern(const JsonAt& spec) {
  if (spec.has("String")) {
    literal_ = spec.str("String");
  } else if (spec.has("Regex")) {
    regex_ = std::make_shared<const Regex>(spec.str("Regex"), "tokenizer.json: " + spec.path() + ".Regex");
  } else {
    spec.fail("a pattern needs a \"String\" or a \"Regex\" member");
  }
}

Pattern Pattern::literal(std::string text) {
  Pattern p;
  p.literal_ = std::move(text);
  return p;
}

Pattern Pattern::regex(const std::string& pattern, const std::string& where) {
  Pattern p;
  p.regex_ = std::make_shared<const Regex>(pattern, where);
  return p;
}

void Pattern::for_each_span(std::string_view text, FunctionRef<void(const Span&)> fn) const {
  if (text.empty()) {
    fn(Span{0, 0, false});
    return;
  }
  size_t prev = 0;
  auto add_match = [&](size_t b, size_t e) {
    if (prev != b) fn(Span{prev, b, false});
    fn(Span{b, e, true});
    prev = e;
  };
  if (regex_) {
    regex_->for_each_match(text, add_match);
  } else if (!literal_.empty()) {
    for (size_t pos = text.find(literal_); pos != std::string_view::npos; pos = text.find(literal_, prev))
      add_match(pos, pos + literal_.size());
  }
  if (prev != text.size()) fn(Span{prev, text.size(), false});
}

std::string Pattern::replace_all(std::string_view text, std::string_view content) const {
  std::string out;
  out.reserve(text.size());
  for_each_span(text, [&](const Span& s) {
    if (s.is_match)
      out.append(content);
    else
      out.append(text.substr(s.begin, s.end - s.begin));
  });
  return out;
}

SplitBehavior parse_split_behavior(const JsonAt& spec) {
  const std::string b = spec.str();
  if (b == "Removed") return SplitBehavior::Removed;
  if (b == "Isolated") return SplitBehavior::Isolated;
  if (b == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::MergedWithNext;
  if (b == "Contiguous") return SplitBehavior::Contiguous;
  spec.fail("unknown split behavior '" + b + "'");
}

void SpanSplitter::flush() {
  if (has_pending_ && pending_.end > pending_.begin) emit_(text_.substr(pending_.begin, pending_.end - pending_.begin));
  has_pending_ = false;
}

void SpanSplitter::add(Span s) {
  if (invert_) s.is_match = !s.is_match;
  const bool previous_match = previous_match_;
  previous_match_ = s.is_match;
  switch (behavior_) {
    case SplitBehavior::Removed:
      if (!s.is_match && s.end > s.begin) emit_(text_.substr(s.begin, s.end - s.begin));
      return;
    case SplitBehavior::Isolated:
      if (s.end > s.begin) emit_(text_.substr(s.begin, s.end - s.begin));
      return;
    case SplitBehavior::MergedWithPrevious:
      // A delimiter joins the piece before it (only the first of consecutive delimiters does).
      if (s.is_match && !previous_match && has_pending_) {
        pending_.end = s.end;
        return;
      }
      break;
    case SplitBehavior::MergedWithNext:
      // A delimiter joins the piece after it when that piece is not a delimiter itself.
      if (has_pending_ && pending_.is_match && !s.is_match) {
        emit_(text_.substr(pending_.begin, s.end - pending_.begin));
        has_pending_ = false;
        return;
      }
      break;
    case SplitBehavior::Contiguous:
      if (has_pending_ && pending_.is_match == s.is_match) {
        pending_.end = s.end;
        return;
      }
      break;
  }
  flush();
  pending_ = s;
  has_pending_ = true;
}

void SpanSplitter::finish() { flush(); }

}  // namespace lathe
