// Where a partial input can be in a Grammar: the set of pushdown stacks (llama.cpp's model of GBNF). A stack
// holds, per open rule, the index of the next element to match; its top is always a character class, and an
// empty stack means the input so far is a complete sentence. Stacks are deduplicated and capped, so an
// ambiguous grammar costs bounded work per code point.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "chat/grammar/grammar.h"

namespace lathe::grammar {

using Stack = std::vector<uint32_t>;

class StackSet {
 public:
  static constexpr size_t kMaxStacks = 1024;
  static constexpr size_t kMaxDepth = 512;
  // Expansion steps per code point: nested nullable rules can branch exponentially before deduplication.
  static constexpr size_t kMaxWork = 1 << 16;

  // The stacks before any input.
  static StackSet start(const Grammar& g);
  // The set holding one stack (expanded like any other; token_tables.cc walks a rule position on its own).
  static StackSet of(const Grammar& g, Stack s);

  // The stacks after one more code point; dead() when the grammar rejects it.
  StackSet advance(const Grammar& g, uint32_t cp) const;
  bool dead() const { return stacks_.empty() && !accepting_; }
  bool accepting() const { return accepting_; }
  // Can another code point follow (some stack is not finished)?
  bool can_continue() const;
  const std::vector<Stack>& stacks() const { return stacks_; }
  // Expansion steps the advance that made this set took (against kMaxWork).
  size_t work() const { return work_; }
  // A byte string naming this set (a cache key for masks).
  std::string key() const;

 private:
  void add(const Grammar& g, Stack s);
  void finish();
  std::vector<Stack> stacks_;
  bool accepting_ = false;
  size_t work_ = 0;
};

// Does the whole of `text` (UTF-8) match the grammar? (for tests and for checking a GBNF before use)
bool grammar_accepts(const Grammar& g, const std::string& text);

}  // namespace lathe::grammar
