// A per-request constraint on which tokens may come next (structured outputs): the sampler asks the state
// for a mask before sampling each step and tells it the chosen token after. The engine knows nothing of
// grammars; chat/grammar implements this for GBNF and JSON schema.
#pragma once
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <vector>

namespace lathe {

class ConstraintState {
 public:
  virtual ~ConstraintState() = default;
  // Sets the logits of tokens that may not come next to -inf.
  virtual void mask(std::span<float> logits) = 0;
  // A cheap check of one token against the same rule as mask(): true only when mask() would surely leave id
  // allowed; false means "ask mask()" (the sampler then builds the full mask, so the result is the same).
  virtual bool allows(int32_t /*id*/) { return false; }
  // The token that was chosen (always one mask() allowed).
  virtual void accept(int32_t id) = 0;
  // The same rule as mask() as a bitset over `vocab` tokens (bit i of word i/64 set = token i allowed), for a
  // device that applies the mask itself. The default asks mask() over zeros; a grammar answers from its cache.
  virtual void allowed_bits(size_t vocab, std::vector<uint64_t>& bits) {
    std::vector<float> probe(vocab, 0.0f);
    mask(probe);
    bits.assign((vocab + 63) / 64, 0);
    for (size_t i = 0; i < vocab; ++i)
      if (probe[i] != -std::numeric_limits<float>::infinity()) bits[i >> 6] |= uint64_t{1} << (i & 63);
  }
};

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // A fresh state for one generation (each row of a batch has its own).
  virtual std::unique_ptr<ConstraintState> start() const = 0;
};

}  // namespace lathe
