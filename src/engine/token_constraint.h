// A per-request constraint on which tokens may come next (structured outputs): the sampler asks the state
// for a mask before sampling each step and tells it the chosen token after. The engine knows nothing of
// grammars; chat/grammar implements this for GBNF and JSON schema.
#pragma once
#include <cstdint>
#include <memory>
#include <span>

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
};

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // A fresh state for one generation (each row of a batch has its own).
  virtual std::unique_ptr<ConstraintState> start() const = 0;
};

}  // namespace lathe
