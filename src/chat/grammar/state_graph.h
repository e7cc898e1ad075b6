// Grammar states met while walking the vocabulary trie, interned, with their transitions memoised by which of
// the state's stack tops a code point matches (inside a JSON string nearly every character behaves the same, so
// a 151k-token walk costs a few lookups per trie node instead of an advance each).
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "chat/grammar/grammar_matcher.h"

namespace lathe::grammar {

class StateGraph {
 public:
  static constexpr size_t kMaxStates = 1 << 16;
  explicit StateGraph(const Grammar& g) : g_(g) {}

  uint32_t intern(StackSet s);
  const StackSet& state(uint32_t id) const { return states_[id]; }
  bool can_continue(uint32_t id) const { return more_[id] != 0; }
  // The deepest stack of state id, and the work its advance took (for the cap guards of token_tables.h).
  size_t depth(uint32_t id) const { return depth_[id]; }
  size_t work(uint32_t id) const { return work_[id]; }

  // The state after cp, or -1 when the grammar rejects it.
  int64_t next(uint32_t id, uint32_t cp);

  // Between walks (ids held by a walk stay valid during it): forget everything past the size bound.
  void trim();

 private:
  const Grammar& g_;
  std::vector<StackSet> states_;
  std::vector<char> more_;  // per state: can another code point follow?
  std::vector<size_t> depth_, work_;
  std::unordered_map<std::string, uint32_t> ids_;
  std::unordered_map<uint64_t, int64_t> trans_;
};

}  // namespace lathe::grammar
