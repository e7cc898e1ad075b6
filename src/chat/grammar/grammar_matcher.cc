#include "chat/grammar/grammar_matcher.h"

#include "chat/grammar/token_trie.h"

#include <algorithm>

namespace lathe::grammar {

void StackSet::add(const Grammar& g, Stack s) {
  if (++work_ > kMaxWork) return;  // readings past the budget are dropped (the output stays valid, only narrower)
  // Frames whose alternative is finished return to their parent.
  while (!s.empty() && g.elems[s.back()].kind == ElemKind::End) s.pop_back();
  if (s.empty()) {
    accepting_ = true;
    return;
  }
  const Element& e = g.elems[s.back()];
  if (e.kind == ElemKind::Chars) {
    if (stacks_.size() < kMaxStacks) stacks_.push_back(std::move(s));
    return;
  }
  if (s.size() >= kMaxDepth) return;  // too deep to follow: this reading is dropped
  const uint32_t rule = e.rule;
  s.back() += 1;
  // A reference in tail position leaves nothing to return to: drop the frame before descending.
  while (!s.empty() && g.elems[s.back()].kind == ElemKind::End) s.pop_back();
  for (uint32_t at : g.rule_alts[rule]) {
    Stack t = s;
    t.push_back(at);
    add(g, std::move(t));
  }
}

void StackSet::finish() {
  std::sort(stacks_.begin(), stacks_.end());
  stacks_.erase(std::unique(stacks_.begin(), stacks_.end()), stacks_.end());
}

StackSet StackSet::start(const Grammar& g) {
  StackSet s;
  for (uint32_t at : g.rule_alts[g.root]) s.add(g, Stack{at});
  s.finish();
  return s;
}

StackSet StackSet::of(const Grammar& g, Stack st) {
  StackSet s;
  s.add(g, std::move(st));
  s.finish();
  return s;
}

StackSet StackSet::advance(const Grammar& g, uint32_t cp) const {
  StackSet out;
  for (const Stack& s : stacks_) {
    if (!g.matches(g.elems[s.back()], cp)) continue;
    Stack t = s;
    t.back() += 1;
    out.add(g, std::move(t));
  }
  out.finish();
  return out;
}

bool StackSet::can_continue() const { return !stacks_.empty(); }

std::string StackSet::key() const {
  std::string k;
  k.push_back(accepting_ ? 'A' : 'a');
  for (const Stack& s : stacks_) {
    for (uint32_t v : s) k.append(reinterpret_cast<const char*>(&v), sizeof v);
    k.append(4, '\xff');
  }
  return k;
}

bool grammar_accepts(const Grammar& g, const std::string& text) {
  std::vector<uint32_t> cps;
  if (!utf8_to_code_points(text, cps)) return false;
  StackSet s = StackSet::start(g);
  for (uint32_t cp : cps) {
    s = s.advance(g, cp);
    if (s.dead()) return false;
  }
  return s.accepting();
}

}  // namespace lathe::grammar
