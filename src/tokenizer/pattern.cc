#include "tokenizer/pattern.h"

#include <algorithm>

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

std::vector<Span> Pattern::spans(std::string_view text) const {
  std::vector<Span> out;
  if (text.empty()) return {{0, 0, false}};
  size_t prev = 0;
  auto add_match = [&](size_t b, size_t e) {
    if (prev != b) out.push_back({prev, b, false});
    out.push_back({b, e, true});
    prev = e;
  };
  if (regex_) {
    for (const auto& [b, e] : regex_->find_all(text)) add_match(b, e);
  } else if (!literal_.empty()) {
    for (size_t pos = text.find(literal_); pos != std::string_view::npos; pos = text.find(literal_, prev))
      add_match(pos, pos + literal_.size());
  }
  if (prev != text.size()) out.push_back({prev, text.size(), false});
  return out;
}

std::string Pattern::replace_all(std::string_view text, std::string_view content) const {
  std::string out;
  out.reserve(text.size());
  for (const Span& s : spans(text)) {
    if (s.is_match)
      out.append(content);
    else
      out.append(text.substr(s.begin, s.end - s.begin));
  }
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

std::vector<std::string> split_spans(std::string_view text, std::vector<Span> spans, SplitBehavior behavior) {
  std::vector<Span> merged;
  merged.reserve(spans.size());
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::Removed:
      for (const Span& s : spans)
        if (!s.is_match) merged.push_back(s);
      break;
    case SplitBehavior::Isolated: merged = std::move(spans); break;
    case SplitBehavior::MergedWithPrevious:
      // A delimiter joins the piece before it (only the first of consecutive delimiters does).
      for (const Span& s : spans) {
        if (s.is_match && !previous_match && !merged.empty())
          merged.back().end = s.end;
        else
          merged.push_back(s);
        previous_match = s.is_match;
      }
      break;
    case SplitBehavior::MergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !merged.empty())
          merged.back().begin = it->begin;
        else
          merged.push_back(*it);
        previous_match = it->is_match;
      }
      std::reverse(merged.begin(), merged.end());
      break;
    case SplitBehavior::Contiguous:
      for (size_t i = 0; i < spans.size(); ++i) {
        const Span& s = spans[i];
        if (i > 0 && s.is_match == previous_match)
          merged.back().end = s.end;
        else
          merged.push_back(s);
        previous_match = s.is_match;
      }
      break;
  }
  std::vector<std::string> out;
  out.reserve(merged.size());
  for (const Span& s : merged)
    if (s.end > s.begin) out.emplace_back(text.substr(s.begin, s.end - s.begin));
  return out;
}

}  // namespace lathe
