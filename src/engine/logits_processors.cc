#include "engine/logits_processors.h"

#include <map>

namespace lathe {
namespace {
std::span<const int32_t> window(std::span<const int32_t> h, int size) {
  if (size <= 0 || static_cast<size_t>(size) >= h.size()) return h;
  return h.subspan(h.size() - static_cast<size_t>(size));
}
bool in_vocab(int32_t id, size_t n) { return id >= 0 && static_cast<size_t>(id) < n; }
}  // namespace

std::vector<LogitEdit> logit_edits(const SamplingParams& p, std::span<const int32_t> history, size_t vocab,
                                   int64_t offset) {
  std::map<int32_t, LogitEdit> by_token;
  for (const auto& [id, bias] : p.logit_bias)
    if (in_vocab(id, vocab)) {
      LogitEdit& e = by_token[id];
      e.bias = bias;
      e.has_bias = true;
    }
  if (p.repetition_penalty != 1.0f)
    for (int32_t id : window(history, p.repetition_context_size))
      if (in_vocab(id, vocab)) {
        LogitEdit& e = by_token[id];
        e.repetition = p.repetition_penalty;
        e.has_repetition = true;
      }
  if (p.presence_penalty != 0.0f)
    for (int32_t id : window(history, p.presence_context_size))
      if (in_vocab(id, vocab)) {
        LogitEdit& e = by_token[id];
        e.presence = p.presence_penalty;
        e.has_presence = true;
      }
  if (p.frequency_penalty != 0.0f)
    for (int32_t id : window(history, p.frequency_context_size))
      if (in_vocab(id, vocab)) {
        LogitEdit& e = by_token[id];
        e.frequency = p.frequency_penalty;
        ++e.occurrences;
      }
  std::vector<LogitEdit> out;
  out.reserve(by_token.size());
  for (auto& [id, e] : by_token) {
    e.index = offset + id;
    out.push_back(e);
  }
  return out;
}

void apply_row_edits(std::vector<float>& logits, const std::vector<LogitEdit>& edits) {
  for (const LogitEdit& e : edits) {
    float& l = logits[static_cast<size_t>(e.index)];
    l = apply_logit_edit(l, e);
  }
}

void apply_logits_processors(std::vector<float>& logits, const SamplingParams& p, std::span<const int32_t> history) {
  apply_row_edits(logits, logit_edits(p, history, logits.size()));
}

}  // namespace lathe
