#include "lab/train/train_packing.h"

#include <algorithm>
#include <map>
#include <string>

#include "common/error.h"

namespace lathe::train {

std::vector<Example> pack_examples(const std::vector<Example>& examples, int64_t max_seq) {
  if (max_seq < 2) throw Error(ErrorKind::InvalidArgument, "packing needs max_seq_length >= 2");
  std::vector<size_t> order(examples.size());
  for (size_t i = 0; i < order.size(); ++i) {
    const Example& e = examples[i];
    if (e.format == RowFormat::Preference || !e.rejected.ids.empty())
      throw Error(ErrorKind::InvalidArgument, e.where + ": packing is for SFT rows, not preference rows");
    if (static_cast<int64_t>(e.seq.ids.size()) > max_seq)
      throw Error(ErrorKind::InvalidArgument, e.where + ": the row is longer than max_seq_length " +
                                                  std::to_string(max_seq) + ", it cannot be packed");
    if (!e.seq.segments.empty()) throw Error(ErrorKind::InvalidArgument, e.where + ": the row is already packed");
    order[i] = i;
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return examples[a].seq.ids.size() > examples[b].seq.ids.size(); });
  std::vector<Example> rows;
  // Free room -> row; lower_bound finds the fullest row with room (earliest made on ties: multimap keeps order).
  std::multimap<int64_t, size_t> room;
  for (size_t i : order) {
    const Example& e = examples[i];
    const int64_t len = static_cast<int64_t>(e.seq.ids.size());
    size_t r;
    if (auto it = room.lower_bound(len); it != room.end()) {
      r = it->second;
      const int64_t left = it->first - len;
      room.erase(it);
      if (left > 0) room.emplace(left, r);
    } else {
      r = rows.size();
      Example fresh;
      fresh.format = e.format;
      fresh.where = e.where;
      rows.push_back(std::move(fresh));
      if (max_seq - len > 0) room.emplace(max_seq - len, r);
    }
    Example& row = rows[r];
    row.seq.ids.insert(row.seq.ids.end(), e.seq.ids.begin(), e.seq.ids.end());
    row.seq.target.insert(row.seq.target.end(), e.seq.target.begin(), e.seq.target.end());
    row.seq.segments.push_back(len);
  }
  // One example per row stays an ordinary row (no segments to check or mask).
  for (Example& row : rows)
    if (row.seq.segments.size() == 1)
      row.seq.segments.clear();
    else
      row.where += " (+" + std::to_string(row.seq.segments.size() - 1) + " packed)";
  return rows;
}

PaddingStats padding_stats(const std::vector<Example>& rows, int64_t batch_size, uint64_t seed) {
  PaddingStats s;
  if (rows.empty()) return s;
  const BatchPlan plan(rows, batch_size, seed);
  for (int64_t b = 0; b < plan.batches_per_epoch(); ++b) {
    int64_t longest = 0, tokens = 0;
    const std::vector<size_t> pick = plan.batch(b);
    for (size_t i : pick) {
      const int64_t n = static_cast<int64_t>(rows[i].seq.ids.size());
      longest = std::max(longest, n);
      tokens += n;
    }
    s.rows += static_cast<int64_t>(pick.size());
    s.tokens += tokens;
    s.pad_tokens += longest * static_cast<int64_t>(pick.size()) - tokens;
  }
  return s;
}

}  // namespace lathe::train
