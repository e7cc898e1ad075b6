// Row -> slot for forward(const Batch&): the engine installs a ForwardContext holding the pinned SlotTable
// (uniform_slot -1); the model's batched forward then opens a BatchScope, which turns each row's
// adapter_slot into one slot per token of the rows it concatenates (or, for the row-by-row reference forward,
// one row's slot). Nothing is installed when every row runs the base model, so such steps keep their
// captured graphs.
#pragma once
#include <optional>

#include "lora/forward_context.h"
#include "model/batch.h"

namespace lathe::lora {

class BatchScope {
 public:
  explicit BatchScope(const Batch& batch);   // all rows' tokens, in row order
  explicit BatchScope(const BatchRow& row);  // one row on its own

 private:
  ForwardContext ctx_;
  std::optional<ScopedContext> scope_;
};

}  // namespace lathe::lora
