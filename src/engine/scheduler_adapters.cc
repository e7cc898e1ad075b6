// The scheduler's forward over rows of several adapter tables: one forward per table, logits back in batch order.
#include <algorithm>

#include "engine/scheduler.h"
#include "engine/scheduler_row.h"
#include "lora/forward_context.h"
#include "tensor/ops.h"

namespace lathe {

// Rows pin the adapter table their request started with; a mount or unmount publishes a new one. Rows of one
// table share a forward (their adapter_slot indexes it); rows of another table (or none) run in their own.
// A new adapter spec publishes a table with one more slot and the others unchanged, so a row pinned to an older
// table usually finds its very Slot at the same index of a newer one: it then runs under that table, and
// requests that named new adapter sets while others streamed still share one mixed forward.
Tensor Scheduler::forward_grouped(const Batch& batch, const std::vector<Row*>& in_batch) {
  const size_t n = batch.rows.size();
  std::vector<const lora::SlotTable*> own(n), host(n), candidates;
  for (size_t i = 0; i < n; ++i) {
    const lora::ForwardContext* a = in_batch[i]->adapters();
    own[i] = a ? a->table.get() : nullptr;
    if (own[i] && std::find(candidates.begin(), candidates.end(), own[i]) == candidates.end())
      candidates.push_back(own[i]);
  }
  std::stable_sort(candidates.begin(), candidates.end(), [](const lora::SlotTable* a, const lora::SlotTable* b) {
    return a->slots.size() > b->slots.size();
  });
  for (size_t i = 0; i < n; ++i) {
    host[i] = own[i];
    const int slot = batch.rows[i].adapter_slot;
    for (const lora::SlotTable* t : candidates) {
      const bool same = slot < 0 || (own[i] && t->slot(slot) && t->slot(slot) == own[i]->slot(slot));
      if (same) {
        host[i] = t;
        break;
      }
    }
  }
  auto table_of = [&](size_t i) { return host[i]; };
  auto pin_of = [&](const lora::SlotTable* t) -> const lora::ForwardContext* {
    for (size_t i = 0; i < n; ++i)
      if (own[i] == t) return in_batch[i]->adapters();
    return nullptr;
  };
  std::vector<const lora::SlotTable*> tables;
  for (size_t i = 0; i < n; ++i)
    if (std::find(tables.begin(), tables.end(), table_of(i)) == tables.end()) tables.push_back(table_of(i));
  auto run = [&](const Batch& b, const lora::SlotTable* table, const lora::ForwardContext* pin) {
    lora::ForwardContext ctx;
    if (table) ctx.table = pin->table;
    const lora::ScopedContext scope(table ? &ctx : nullptr);
    return bundle_.model().forward(b);
  };
  if (tables.size() == 1) return run(batch, tables[0], pin_of(tables[0]));
  // Several tables: one forward each, then the logits rows back in the batch's order.
  std::vector<Tensor> parts(batch.rows.size());
  for (const lora::SlotTable* t : tables) {
    Batch sub;
    std::vector<size_t> index;
    const lora::ForwardContext* pin = pin_of(t);
    for (size_t i = 0; i < batch.rows.size(); ++i)
      if (table_of(i) == t) {
        sub.rows.push_back(batch.rows[i]);
        index.push_back(i);
      }
    if (sub.logit_rows() == 0) {
      run(sub, t, pin);
      continue;
    }
    const Tensor l = run(sub, t, pin);
    int64_t k = 0;
    for (size_t j = 0; j < index.size(); ++j)
      if (sub.rows[j].want_logits) parts[index[j]] = l.slice(0, k, k + 1), ++k;
  }
  Tensor out;
  int64_t k = 0;
  for (size_t i = 0; i < batch.rows.size(); ++i) {
    if (!batch.rows[i].want_logits) continue;
    if (!out.defined()) out = Tensor::empty({batch.logit_rows(), parts[i].dim(1)}, parts[i].dtype(), parts[i].device());
    copy_rows(out, k++, parts[i], 0, 1);
  }
  return out;
}

}  // namespace lathe
