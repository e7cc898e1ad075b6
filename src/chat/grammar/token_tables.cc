#include "chat/grammar/token_tables.h"

#include <algorithm>

namespace lathe::grammar {
namespace {

void set_bit(std::vector<uint64_t>& bits, int32_t id) {
  bits[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (static_cast<size_t>(id) & 63);
}
bool has_bit(const std::vector<uint64_t>& bits, int32_t id) {
  return (bits[static_cast<size_t>(id) >> 6] >> (static_cast<size_t>(id) & 63)) & 1;
}

void walk(StateGraph& graph, const TokenTrie::Flat& f, uint32_t node, uint32_t state, std::vector<uint64_t>& bits) {
  for (uint32_t child = f.child_at[node]; child < f.child_at[node + 1]; ++child) {
    const int64_t next = graph.next(state, f.cp[child]);
    if (next < 0) continue;
    for (uint32_t k = f.token_at[child]; k < f.token_at[child + 1]; ++k) set_bit(bits, f.tokens[k]);
    if (f.child_at[child + 1] > f.child_at[child] && graph.can_continue(static_cast<uint32_t>(next)))
      walk(graph, f, child, static_cast<uint32_t>(next), bits);
  }
}

// The walk from a stack's top frames. state < 0: no reading is left inside them; escaped: some reading left them
// above this node (tokens below are then uncertain unless a reading inside still takes them). whole: the frames are
// the whole stack, so leaving them completes the sentence: accepted at a token's end, nothing after. False when
// the uncertain tokens pass the bound (the table is then not worth finishing).
bool classify(StateGraph& graph, const TokenTrie::Flat& f, uint32_t node, int64_t state, bool escaped, bool whole,
              TokenTables::Table& t) {
  for (uint32_t child = f.child_at[node]; child < f.child_at[node + 1]; ++child) {
    const int64_t next = state >= 0 ? graph.next(static_cast<uint32_t>(state), f.cp[child]) : -1;
    const bool inside = next >= 0 && graph.can_continue(static_cast<uint32_t>(next));
    const bool leaves = next >= 0 && graph.state(static_cast<uint32_t>(next)).accepting();
    if (next >= 0) {
      const auto n = static_cast<uint32_t>(next);
      t.max_depth = std::max(t.max_depth, graph.depth(n));
      t.max_stacks = std::max(t.max_stacks, graph.state(n).stacks().size());
      t.max_work = std::max(t.max_work, graph.work(n));
    }
    // Leaving exactly at the token's end still expands the frames below: uncertain too (unless there are none),
    // so that what the tables call accepted never involves the context at all.
    for (uint32_t k = f.token_at[child]; k < f.token_at[child + 1]; ++k) {
      if (inside || (whole && leaves))
        set_bit(t.accepted, f.tokens[k]);
      else if (!whole && (escaped || leaves))
        t.uncertain.push_back(f.tokens[k]);
    }
    if (t.uncertain.size() > TokenTables::kMaxUncertain) return false;
    const bool go = inside || (!whole && (escaped || leaves));
    if (f.child_at[child + 1] > f.child_at[child] && go &&
        !classify(graph, f, child, inside ? next : -1, escaped || leaves, whole, t))
      return false;
  }
  return true;
}

std::string key_of(const Stack& st, size_t frames) {
  std::string k(frames == st.size() ? "W" : "p");
  for (size_t i = st.size() - frames; i < st.size(); ++i) k.append(reinterpret_cast<const char*>(&st[i]), 4);
  return k;
}

}  // namespace

std::shared_ptr<const TokenTables::Table> TokenTables::build(const Stack& st, size_t frames) {
  auto t = std::make_shared<Table>();
  t->frames = frames;
  t->accepted.assign((trie_.vocab_size() + 63) / 64, 0);
  local_.trim();
  const uint32_t start = local_.intern(StackSet::of(g_, Stack(st.end() - static_cast<long>(frames), st.end())));
  t->max_depth = local_.depth(start);
  t->max_stacks = local_.state(start).stacks().size();
  t->max_work = local_.work(start);
  if (!classify(local_, trie_.flat(), 0, start, false, frames == st.size(), *t)) {
    t->deeper = true;
    t->accepted.clear();
    t->uncertain.clear();
  }
  return t;
}

std::shared_ptr<const TokenTables::Table> TokenTables::get(const Stack& st) {
  for (size_t frames = 1; frames <= st.size(); ++frames) {
    std::string key = key_of(st, frames);
    auto it = tables_.find(key);
    if (it == tables_.end()) {
      auto t = build(st, frames);
      const size_t size = 64 + t->accepted.size() * 8 + t->uncertain.size() * 4;
      if (bytes_ + size > kMaxBytes) {  // start over (tables in use stay alive through their shared_ptr)
        tables_.clear();
        bytes_ = 0;
      }
      bytes_ += size;
      it = tables_.emplace(std::move(key), std::move(t)).first;
    }
    if (!it->second->deeper) return it->second;
  }
  return nullptr;  // unreachable: a whole-stack table has no uncertain tokens
}

bool tabled_walk(TokenTables& tables, StateGraph& graph, const TokenTrie& trie, const StackSet& s,
                 std::vector<uint64_t>& bits) {
  std::vector<std::shared_ptr<const TokenTables::Table>> ts;
  // Union of the stacks' own readings is exact while no advance of the whole state reaches a cap: guard with
  // what the local walks reached, summed over the stacks, with room to spare for the frames below.
  size_t stacks = 0, work = 0;
  for (const Stack& st : s.stacks()) {
    auto t = tables.get(st);
    if (!t || st.size() - t->frames + t->max_depth + 8 >= StackSet::kMaxDepth) return false;
    stacks += t->max_stacks;
    work += t->max_work;
    if (std::find(ts.begin(), ts.end(), t) == ts.end()) ts.push_back(std::move(t));
  }
  if (stacks * 4 > StackSet::kMaxStacks || work * 4 > StackSet::kMaxWork) return false;
  for (const auto& t : ts)
    for (size_t w = 0; w < bits.size(); ++w) bits[w] |= t->accepted[w];
  graph.trim();
  const uint32_t from = graph.intern(s);
  for (const auto& t : ts) {
    for (int32_t id : t->uncertain) {
      if (has_bit(bits, id)) continue;
      // As the full walk: each code point must leave a live state, and one with stacks for the next.
      int64_t at = from;
      const std::vector<uint32_t>& text = trie.text(id);
      for (size_t i = 0; i < text.size() && at >= 0; ++i) {
        if (i > 0 && !graph.can_continue(static_cast<uint32_t>(at))) at = -1;
        if (at >= 0) at = graph.next(static_cast<uint32_t>(at), text[i]);
      }
      if (at >= 0) set_bit(bits, id);
    }
  }
  return true;
}

void full_walk(StateGraph& graph, const TokenTrie& trie, const StackSet& s, std::vector<uint64_t>& bits) {
  graph.trim();
  walk(graph, trie.flat(), 0, graph.intern(s), bits);
}

}  // namespace lathe::grammar
