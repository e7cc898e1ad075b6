// A compiled grammar as the sampler's TokenConstraint: each step the row's grammar state yields the tokens
// whose text it can take (from per-rule-position token tables, token_tables.h), EOS only where the
// output so far is complete, and only EOS once nothing else can follow. Masks are kept per grammar state and
// shared, with the tables, by all generations of one constraint (server/structured_output.cc reuses constraints by
// grammar text).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "chat/grammar/grammar.h"
#include "chat/grammar/token_trie.h"
#include "engine/token_constraint.h"

namespace lathe::grammar {

struct ConstraintOptions {
  std::vector<int32_t> eos_ids;
  // Special tokens the grammar may place (matched by their text, e.g. "<tool_call>"); others never come.
  std::vector<int32_t> allowed_special;
  // When ≥ 0, the grammar applies only after this token has been generated (e.g. "</think>": reasoning first).
  int32_t start_after = -1;
  // Masks from per-position token tables (token_tables.h); false walks the whole vocabulary per state, the
  // reference the tables are tested and benchmarked against (same masks).
  bool tables = true;
};

class GrammarConstraint : public TokenConstraint {
 public:
  GrammarConstraint(std::shared_ptr<const Grammar> g, std::shared_ptr<const TokenTrie> trie, ConstraintOptions o);
  std::unique_ptr<ConstraintState> start() const override;

  const Grammar& grammar() const { return *grammar_; }
  const TokenTrie& trie() const { return *trie_; }
  const ConstraintOptions& options() const { return opt_; }

  struct Shared;  // masks by grammar state, shared by every generation under this constraint

 private:
  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const TokenTrie> trie_;
  ConstraintOptions opt_;
  std::shared_ptr<Shared> shared_;
};

class TokenTables;

// The allowed tokens of one grammar state (exposed for tests and the benchmark): by a walk over the whole
// vocabulary, or from per-position tables (token_tables.h; the same set) when given.
std::vector<char> allowed_tokens(const Grammar& g, const TokenTrie& trie, const class StackSet& state,
                                 const ConstraintOptions& o, TokenTables* tables = nullptr);

// Whether the walk behind allowed_tokens reaches token id, from its text alone (EOS aside: it also depends on
// whether anything else is allowed). A few advances instead of a vocabulary walk: the sampler's fast check.
bool token_fits(const Grammar& g, const TokenTrie& trie, const class StackSet& state, const ConstraintOptions& o,
                int32_t id);

}  // namespace lathe::grammar
