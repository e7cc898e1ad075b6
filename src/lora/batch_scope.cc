#include "lora/batch_scope.h"

#include "common/error.h"

namespace lathe::lora {
namespace {
std::shared_ptr<const SlotTable> installed_table(int slot) {
  const ForwardContext* c = current_context();
  if (!c || !c->table)
    throw Error(ErrorKind::Internal, "forward: a batch row asks for adapter slot " + std::to_string(slot) +
                                         " but no adapter table is installed for this forward");
  if (!c->table->slot(slot))
    throw Error(ErrorKind::Internal, "forward: adapter slot " + std::to_string(slot) + " is not in the table");
  return c->table;
}
}  // namespace

BatchScope::BatchScope(const Batch& batch) {
  bool any = false;
  for (const BatchRow& r : batch.rows) any = any || r.adapter_slot >= 0;
  if (!any) return;
  for (const BatchRow& r : batch.rows) {
    if (r.adapter_slot >= 0) ctx_.table = installed_table(r.adapter_slot);
    ctx_.token_slots.insert(ctx_.token_slots.end(), r.ids.size(), r.adapter_slot);
  }
  scope_.emplace(&ctx_);
}

BatchScope::BatchScope(const BatchRow& row) {
  if (row.adapter_slot < 0) {
    if (current_context()) scope_.emplace(nullptr);  // this row runs the base model
    return;
  }
  ctx_.table = installed_table(row.adapter_slot);
  ctx_.uniform_slot = row.adapter_slot;
  scope_.emplace(&ctx_);
}

}  // namespace lathe::lora
