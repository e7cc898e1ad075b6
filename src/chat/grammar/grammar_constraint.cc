#include "chat/grammar/grammar_constraint.h"

#include <algorithm>
#include <limits>
#include <mutex>
#include <unordered_map>

#include "chat/grammar/grammar_matcher.h"

namespace lathe::grammar {
namespace {

constexpr size_t kMaxCachedStates = 1024;  // bitsets of vocab/8 bytes (19 KiB for 151k tokens)
constexpr size_t kMaxGraphStates = 1 << 16;
bool accepts_text(const Grammar& g, StackSet s, const std::vector<uint32_t>& text) {
  for (uint32_t cp : text) {
    s = s.advance(g, cp);
    if (s.dead()) return false;
  }
  return true;
}

// Grammar states met while walking the vocabulary, interned, with their transitions memoised by which of the
// state's stack tops a code point matches (inside a JSON string nearly every character behaves the same, so
// a 151k-token walk costs a few lookups per trie node instead of an advance each).
class StateGraph {
 public:
  explicit StateGraph(const Grammar& g) : g_(g) {}

  uint32_t intern(StackSet s) {
    std::string key = s.key();
    auto it = ids_.find(key);
    if (it != ids_.end()) return it->second;
    const uint32_t id = static_cast<uint32_t>(states_.size());
    more_.push_back(s.can_continue());
    states_.push_back(std::move(s));
    ids_.emplace(std::move(key), id);
    return id;
  }
  const StackSet& state(uint32_t id) const { return states_[id]; }
  bool can_continue(uint32_t id) const { return more_[id] != 0; }

  // The state after cp, or -1 when the grammar rejects it.
  int64_t next(uint32_t id, uint32_t cp) {
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

  // Between walks (ids held by a walk stay valid during it): forget everything past the size bound.
  void trim() {
    if (states_.size() <= kMaxGraphStates) return;
    states_.clear();
    more_.clear();
    ids_.clear();
    trans_.clear();
  }

 private:
  const Grammar& g_;
  std::vector<StackSet> states_;
  std::vector<char> more_;  // per state: can another code point follow?
  std::unordered_map<std::string, uint32_t> ids_;
  std::unordered_map<uint64_t, int64_t> trans_;
};

void walk(StateGraph& graph, const TokenTrie::Flat& f, uint32_t node, uint32_t state, std::vector<char>& allowed) {
  for (uint32_t child = f.child_at[node]; child < f.child_at[node + 1]; ++child) {
    const int64_t next = graph.next(state, f.cp[child]);
    if (next < 0) continue;
    for (uint32_t k = f.token_at[child]; k < f.token_at[child + 1]; ++k) allowed[static_cast<size_t>(f.tokens[k])] = 1;
    if (f.child_at[child + 1] > f.child_at[child] && graph.can_continue(static_cast<uint32_t>(next)))
      walk(graph, f, child, static_cast<uint32_t>(next), allowed);
  }
}

std::vector<char> mask_of(StateGraph& graph, const Grammar& g, const TokenTrie& trie, const StackSet& s,
                          const ConstraintOptions& o) {
  std::vector<char> allowed(trie.vocab_size(), 0);
  if (s.can_continue()) {
    graph.trim();
    walk(graph, trie.flat(), 0, graph.intern(s), allowed);
    for (int32_t id : o.allowed_special)
      if (id >= 0 && static_cast<size_t>(id) < allowed.size() && accepts_text(g, s, trie.text(id)))
        allowed[static_cast<size_t>(id)] = 1;
  }
  const bool any = std::find(allowed.begin(), allowed.end(), 1) != allowed.end();
  // EOS where the output is complete, and as the only way out of a dead end.
  if (s.accepting() || !any)
    for (int32_t id : o.eos_ids)
      if (id >= 0 && static_cast<size_t>(id) < allowed.size()) allowed[static_cast<size_t>(id)] = 1;
  return allowed;
}

}  // namespace

// Allowed-token bitsets by grammar state, shared by every request of one compiled grammar (a schema sent again
// and again finds its masks computed), with the state graph their walks built.
struct GrammarConstraint::Shared {
  explicit Shared(const Grammar& g) : graph(g) {}
  std::mutex mu;
  StateGraph graph;
  std::unordered_map<std::string, std::shared_ptr<const std::vector<uint64_t>>> masks;
};

namespace {

class GrammarState : public ConstraintState {
 public:
  explicit GrammarState(const GrammarConstraint& c, GrammarConstraint::Shared& shared)
      : c_(c), shared_(shared), state_(StackSet::start(c.grammar())), active_(c.options().start_after < 0) {}

  void mask(std::span<float> logits) override {
    if (!active_) return;
    load_bits();
    const std::vector<uint64_t>& bits = *bits_;
    const size_t n = std::min(logits.size(), c_.trie().vocab_size());
    constexpr float kOff = -std::numeric_limits<float>::infinity();
    // A word at a time: inside strings most words are all ones and cost one test.
    for (size_t w = 0; w * 64 < n; ++w) {
      const uint64_t word = bits[w];
      if (word == ~uint64_t{0}) continue;
      const size_t end = std::min(n, w * 64 + 64);
      for (size_t i = w * 64; i < end; ++i)
        if (!((word >> (i & 63)) & 1)) logits[i] = kOff;
    }
    for (size_t i = n; i < logits.size(); ++i) logits[i] = kOff;
  }

  bool allows(int32_t id) override {
    if (!active_) return true;
    if (id < 0 || static_cast<size_t>(id) >= c_.trie().vocab_size()) return false;
    if (token_fits(c_.grammar(), c_.trie(), state_, c_.options(), id)) return true;
    // EOS where the output is complete; otherwise only the full mask can say (it is allowed in a dead end).
    const auto& eos = c_.options().eos_ids;
    return state_.accepting() && std::find(eos.begin(), eos.end(), id) != eos.end();
  }

  void accept(int32_t id) override {
    if (!active_) {
      active_ = id == c_.options().start_after;
      return;
    }
    const auto& eos = c_.options().eos_ids;
    if (std::find(eos.begin(), eos.end(), id) != eos.end()) return;
    if (id < 0 || static_cast<size_t>(id) >= c_.trie().vocab_size()) return;
    StackSet s = state_;
    for (uint32_t cp : c_.trie().text(id)) s = s.advance(c_.grammar(), cp);
    state_ = std::move(s);  // a dead state (a token the mask did not allow) leaves only EOS
  }

 private:
  void load_bits() {
    std::string key = state_.key();
    std::lock_guard<std::mutex> lock(shared_.mu);
    auto it = shared_.masks.find(key);
    if (it == shared_.masks.end()) {
      const std::vector<char> allowed = mask_of(shared_.graph, c_.grammar(), c_.trie(), state_, c_.options());
      auto bits = std::make_shared<std::vector<uint64_t>>((allowed.size() + 63) / 64, 0);
      for (size_t i = 0; i < allowed.size(); ++i)
        if (allowed[i]) (*bits)[i >> 6] |= uint64_t{1} << (i & 63);
      if (shared_.masks.size() >= kMaxCachedStates) shared_.masks.clear();
      it = shared_.masks.emplace(std::move(key), std::move(bits)).first;
    }
    bits_ = it->second;  // shared, not copied: the cache may drop it while this row still reads it
  }

  const GrammarConstraint& c_;
  GrammarConstraint::Shared& shared_;
  StackSet state_;
  bool active_;
  std::shared_ptr<const std::vector<uint64_t>> bits_;
};

}  // namespace

std::vector<char> allowed_tokens(const Grammar& g, const TokenTrie& trie, const StackSet& s,
                                 const ConstraintOptions& o) {
  StateGraph graph(g);
  return mask_of(graph, g, trie, s, o);
}

bool token_fits(const Grammar& g, const TokenTrie& trie, const StackSet& s, const ConstraintOptions& o, int32_t id) {
  if (id < 0 || static_cast<size_t>(id) >= trie.vocab_size() || !s.can_continue()) return false;
  // mask_of places a token the grammar may name by its text (special tokens only this way).
  if (std::find(o.allowed_special.begin(), o.allowed_special.end(), id) != o.allowed_special.end() &&
      accepts_text(g, s, trie.text(id)))
    return true;
  if (trie.is_special(id)) return false;
  const std::vector<uint32_t>& text = trie.text(id);
  // Outside the trie (no text, or only part of a character): the walk never reaches it.
  return !text.empty() && accepts_text(g, s, text);
}

GrammarConstraint::GrammarConstraint(std::shared_ptr<const Grammar> g, std::shared_ptr<const TokenTrie> trie,
                                     ConstraintOptions o)
    : grammar_(std::move(g)),
      trie_(std::move(trie)),
      opt_(std::move(o)),
      shared_(std::make_shared<Shared>(*grammar_)) {}

std::unique_ptr<ConstraintState> GrammarConstraint::start() const {
  return std::make_unique<GrammarState>(*this, *shared_);
}

}  // namespace lathe::grammar
