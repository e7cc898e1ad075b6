// Per rule position, the tokens a grammar accepts or rejects whatever lies below on the stack (xgrammar's idea):
// walking the vocabulary from a stack top alone, a token whose text the top frame's rule takes (some reading still
// inside it after the last character) is accepted under any context, one it rejects before the rule could end is
// rejected under any context, and only a token that runs past the rule's end depends on the frames below
// ("uncertain"). A position right at a rule's end (whitespace before a value, a closing quote) leaves most of the
// vocabulary uncertain, so a table is keyed by the top frames of a stack, as few as keep the uncertain tokens few:
// one frame for a string's characters (shared by every string of the schema), more where the rule ends soon, the
// whole stack at most (then nothing is uncertain: leaving it ends the sentence). A state's mask is then the union of
// its tops' accepted bitsets plus a check of their few uncertain tokens against the whole state: a bitset OR and a
// short walk instead of a walk over the vocabulary.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "chat/grammar/state_graph.h"
#include "chat/grammar/token_trie.h"

namespace lathe::grammar {

class TokenTables {
 public:
  // Tables kept per grammar before the cache starts over (a bitset is vocab/8 bytes: 19 KiB for 151k tokens).
  static constexpr size_t kMaxBytes = size_t{16} << 20;
  // A table with more uncertain tokens than this is dropped for one keyed by one more frame.
  static constexpr size_t kMaxUncertain = 2048;

  struct Table {
    std::vector<uint64_t> accepted;  // bit i: token i is taken under any context
    std::vector<int32_t> uncertain;  // tokens whose fate the frames below decide
    // The most any local walk reached: stack depth, stacks in one set, expansion work of one advance. The caps
    // of grammar_matcher.h apply to a whole state; a state near them takes the full walk (see tabled_walk).
    size_t max_depth = 0, max_stacks = 0, max_work = 0;
    size_t frames = 0;    // top frames of the stack it was walked from
    bool deeper = false;  // too many uncertain: look up the next deeper key instead (no bitset kept)
  };

  TokenTables(const Grammar& g, const TokenTrie& trie) : g_(g), trie_(trie), local_(g) {}
  // The table for the stack st, built on first use. Not thread safe: the caller holds its constraint's lock.
  std::shared_ptr<const Table> get(const Stack& st);

 private:
  const Grammar& g_;
  const TokenTrie& trie_;
  StateGraph local_;  // states of walks from a single rule position
  std::shared_ptr<const Table> build(const Stack& st, size_t frames);
  std::unordered_map<std::string, std::shared_ptr<const Table>> tables_;
  size_t bytes_ = 0;
};

// Sets in bits (vocab bits, zeroed by the caller) the trie tokens state s allows, from the tables; graph holds the
// states the uncertain tokens meet. False (bits untouched) when s is near the matcher's caps, where a token's fate
// can depend on the other stacks: the caller then takes the full walk.
bool tabled_walk(TokenTables& tables, StateGraph& graph, const TokenTrie& trie, const StackSet& s,
                 std::vector<uint64_t>& bits);

// The same set by a walk over the whole vocabulary trie (the reference the tables are tested against).
void full_walk(StateGraph& graph, const TokenTrie& trie, const StackSet& s, std::vector<uint64_t>& bits);

}  // namespace lathe::grammar
