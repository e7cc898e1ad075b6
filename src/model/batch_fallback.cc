// The reference batched forward: each row on its own, logits gathered in row order. Architectures that share
// weight reads across rows override Model::forward(const Batch&); this stays the definition they must match.
#include "common/error.h"
#include "lora/batch_scope.h"
#include "model/model.h"

namespace lathe {

Tensor Model::forward(const Batch& batch) {
  if (batch.rows.empty()) throw Error(ErrorKind::InvalidArgument, "forward: empty batch");
  std::vector<Tensor> rows;
  for (const BatchRow& r : batch.rows) {
    if (!r.caches) throw Error(ErrorKind::InvalidArgument, "forward: batch row without a sequence");
    const lora::BatchScope adapters(r);  // the row's adapter set, over the table the engine installed
    Tensor l = forward(r.ids, *r.caches, /*all_logits=*/false);
    if (r.want_logits) rows.push_back(l);
  }
  if (rows.empty()) return Tensor();
  const int64_t vocab = rows.front().dim(1);
  Tensor out = Tensor::empty({static_cast<int64_t>(rows.size()), vocab}, DType::F32, rows.front().device());
  for (size_t i = 0; i < rows.size(); ++i) copy_rows(out, static_cast<int64_t>(i), rows[i], 0, 1);
  return out;
}

}  // namespace lathe
