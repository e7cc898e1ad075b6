// The `pattern` of Split / Replace: a literal string or a regex, and the split behaviours built on its matches.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/function_ref.h"
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

  // Calls `fn` with the matches and the text between them, covering `text` in order (one non-match span for
  // empty text).
  void for_each_span(std::string_view text, FunctionRef<void(const Span&)> fn) const;
  std::string replace_all(std::string_view text, std::string_view content) const;

 private:
  Pattern() = default;
  std::string literal_;
  std::shared_ptr<const Regex> regex_;
};

// How the matched delimiters join the pieces (HF SplitDelimiterBehavior).
enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };
SplitBehavior parse_split_behavior(const JsonAt& spec);

// Applies a split behaviour to spans fed in order, emitting the non-empty pieces as soon as they are final.
class SpanSplitter {
 public:
  SpanSplitter(std::string_view text, SplitBehavior behavior, bool invert, FunctionRef<void(std::string_view)> emit)
      : text_(text), behavior_(behavior), invert_(invert), emit_(emit) {}
  void add(Span span);
  void finish();

 private:
  void flush();
  std::string_view text_;
  SplitBehavior behavior_;
  bool invert_;
  FunctionRef<void(std::string_view)> emit_;
  Span pending_{0, 0, false};
  bool has_pending_ = false;
  bool previous_match_ = false;
};

}  // namespace lathe
