#include "chat/grammar/state_graph.h"

#include <algorithm>

namespace lathe::grammar {

uint32_t StateGraph::intern(StackSet s) {
  std::string key = s.key();
  auto it = ids_.find(key);
  if (it != ids_.end()) return it->second;
  const uint32_t id = static_cast<uint32_t>(states_.size());
  more_.push_back(s.can_continue());
  size_t d = 0;
  for (const Stack& st : s.stacks()) d = std::max(d, st.size());
  depth_.push_back(d);
  work_.push_back(s.work());
  states_.push_back(std::move(s));
  ids_.emplace(std::move(key), id);
  return id;
}

int64_t StateGraph::next(uint32_t id, uint32_t cp) {
  const StackSet& s = states_[id];
  const auto& stacks = s.stacks();
  uint64_t sig;
  if (stacks.size() <= 31) {
    uint32_t mask = 0;
    for (size_t i = 0; i < stacks.size(); ++i)
      if (g_.matches(g_.elems[stacks[i].back()], cp)) mask |= 1u << i;
    if (mask == 0) return -1;
    sig = mask;
  } else {
    sig = 0x80000000u | cp;
  }
  const uint64_t key = (static_cast<uint64_t>(id) << 32) | sig;
  auto it = trans_.find(key);
  if (it != trans_.end()) return it->second;
  StackSet n = s.advance(g_, cp);
  const int64_t to = n.dead() ? -1 : static_cast<int64_t>(intern(std::move(n)));
  trans_.emplace(key, to);
  return to;
}

void StateGraph::trim() {
  if (states_.size() <= kMaxStates) return;
  states_.clear();
  more_.clear();
  depth_.clear();
  work_.clear();
  ids_.clear();
  trans_.clear();
}

}  // namespace lathe::grammar
