#include "model/batch_rows.h"

#include <set>

#include "common/error.h"
#include "tensor/ops.h"

namespace lathe {

RowSpans layout_rows(const Batch& batch, size_t cache_count, size_t pos_layer) {
  if (batch.rows.empty()) throw Error(ErrorKind::InvalidArgument, "forward: empty batch");
  RowSpans s;
  std::set<const CacheList*> seen;
  for (size_t r = 0; r < batch.rows.size(); ++r) {
    const BatchRow& row = batch.rows[r];
    const std::string which = "forward: batch row " + std::to_string(r);
    if (!row.caches) throw Error(ErrorKind::InvalidArgument, which + " has no sequence");
    if (row.ids.empty()) throw Error(ErrorKind::InvalidArgument, which + " has no tokens");
    if (row.caches->size() != cache_count)
      throw Error(ErrorKind::InvalidArgument, which + ": cache list does not match the model");
    if (!seen.insert(row.caches).second)
      throw Error(ErrorKind::InvalidArgument, which + " repeats a sequence already in the batch");
    s.start.push_back(s.tokens());
    s.len.push_back(static_cast<int64_t>(row.ids.size()));
    s.pos0.push_back(cache_count > 0 ? (*row.caches)[pos_layer]->offset() : 0);
    s.caches.push_back(row.caches);
    s.ids.insert(s.ids.end(), row.ids.begin(), row.ids.end());
    if (row.want_logits) s.logit_rows.push_back(static_cast<int32_t>(s.tokens() - 1));
  }
  s.device_ids = batch.device_ids;
  s.device_id_rows = batch.device_ids ? static_cast<int64_t>(batch.rows.size()) : 0;
  return s;
}

RowSpans single_row(const std::vector<int32_t>& ids, CacheList& caches, bool all_logits) {
  RowSpans s;
  s.ids = ids;
  s.start = {0};
  s.len = {static_cast<int64_t>(ids.size())};
  s.pos0 = {caches.empty() ? 0 : caches[0]->offset()};
  s.caches = {&caches};
  for (int64_t t = all_logits ? 0 : s.tokens() - 1; t < s.tokens(); ++t)
    s.logit_rows.push_back(static_cast<int32_t>(t));
  return s;
}

Tensor row_part(const Tensor& x, const RowSpans& s, size_t r) { return x.slice(0, s.start[r], s.start[r] + s.len[r]); }

Tensor concat_rows(const std::vector<Tensor>& parts) {
  LATHE_CHECK(!parts.empty(), "concat_rows: nothing to join");
  if (parts.size() == 1) return parts.front().contiguous();
  Shape shape = parts.front().shape();
  shape[0] = 0;
  for (const Tensor& p : parts) shape[0] += p.dim(0);
  Tensor out = Tensor::empty(shape, parts.front().dtype(), parts.front().device());
  int64_t row = 0;
  for (const Tensor& p : parts) {
    copy_rows(out, row, p, 0, p.dim(0));
    row += p.dim(0);
  }
  return out;
}

Tensor logit_inputs(const Tensor& h, const RowSpans& s) {
  const int64_t n = static_cast<int64_t>(s.logit_rows.size());
  if (n == 0) return Tensor();
  // One contiguous run (the usual decode step: every row wants its token's logits) is a view.
  bool run = true;
  for (int64_t i = 1; i < n && run; ++i) run = s.logit_rows[static_cast<size_t>(i)] == s.logit_rows[0] + i;
  if (run) return h.slice(0, s.logit_rows[0], s.logit_rows[0] + n);
  return gather_rows(h, s.logit_rows);
}

}  // namespace lathe
