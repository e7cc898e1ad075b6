// The `pattern` of Split / Replace: a literal string or a regex, and the split behaviours built on its matches.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/json_at.h"
#include "tokenizer/regex.h"

namespace lathe {

// A piece of the input: [begin, end) byte offsets and whether it was a match of the pattern.
struct Span {
  size_t begin;
  size_t end;
  bool is_match;
};

class Pattern {
 public:
  explicit Pattern(const JsonAt& spec);  // {"String": "..."} or {"Regex": "..."}
  static Pattern literal(std::string text);
  static Pattern regex(const std::string& pattern, const std::string& where);

  // Matches and the text between them, covering `text` in order (one non-match span for empty text).
  std::vector<Span> spans(std::string_view text) const;
  std::string replace_all(std::string_view text, std::string_view content) const;

 private:
  Pattern() = default;
  std::string literal_;
  std::shared_ptr<const Regex> regex_;
};

// How the matched delimiters join the pieces (HF SplitDelimiterBehavior).
enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };
SplitBehavior parse_split_behavior(const JsonAt& spec);

// Applies `behavior` to `spans` and returns the non-empty pieces in order.
std::vector<std::string> split_spans(std::string_view text, std::vector<Span> spans, SplitBehavior behavior);

}  // namespace lathe
