#include "engine/logits_processors.h"

#include <map>
#include <set>

namespace lathe {
namespace {
std::span<const int32_t> window(std::span<const int32_t> h, int size) {
  if (size <= 0 || static_cast<size_t>(size) >= h.size()) return h;
  return h.subspan(h.size() - static_cast<size_t>(size));
}
bool in_vocab(int32_t id, size_t n) { return id >= 0 && static_cast<size_t>(id) < n; }
}  // namespace

void apply_logits_processors(std::vector<float>& logits, const SamplingParams& p, std::span<const int32_t> history) {
  const size_t n = logits.size();
  for (const auto& [id, bias] : p.logit_bias)
    if (in_vocab(id, n)) logits[static_cast<size_t>(id)] += bias;
  if (p.repetition_penalty != 1.0f) {
    std::set<int32_t> seen;
    for (int32_t id : window(history, p.repetition_context_size))
      if (in_vocab(id, n) && seen.insert(id).second) {
        float& l = logits[static_cast<size_t>(id)];
        l = l < 0 ? l * p.repetition_penalty : l / p.repetition_penalty;
      }
  }
  if (p.presence_penalty != 0.0f) {
    std::set<int32_t> seen;
    for (int32_t id : window(history, p.presence_context_size))
      if (in_vocab(id, n) && seen.insert(id).second) logits[static_cast<size_t>(id)] -= p.presence_penalty;
  }
  if (p.frequency_penalty != 0.0f)
    for (int32_t id : window(history, p.frequency_context_size))
      if (in_vocab(id, n)) logits[static_cast<size_t>(id)] -= p.frequency_penalty;
}

}  // namespace lathe
