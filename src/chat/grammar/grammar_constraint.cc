#include "chat/grammar/grammar_constraint.h"

#include <algorithm>
#include <limits>
#include <mutex>
#include <unordered_map>

#include "chat/grammar/grammar_matcher.h"
#include "chat/grammar/state_graph.h"
#include "chat/grammar/token_tables.h"

namespace lathe::grammar {
namespace {

constexpr size_t kMaxCachedStates = 1024;  // bitsets of vocab/8 bytes (19 KiB for 151k tokens)

bool accepts_text(const Grammar& g, StackSet s, const std::vector<uint32_t>& text) {
  for (uint32_t cp : text) {
    s = s.advance(g, cp);
    if (s.dead()) return false;
  }
  return true;
}

// The allowed-token bitset of state s: from the per-position tables when given (a walk over the vocabulary
// otherwise, or where the tables decline), then the special tokens the grammar names and EOS.
std::vector<uint64_t> mask_of(StateGraph& graph, TokenTables* tables, const Grammar& g, const TokenTrie& trie,
                              const StackSet& s, const ConstraintOptions& o) {
  std::vector<uint64_t> bits((trie.vocab_size() + 63) / 64, 0);
  auto set = [&](int32_t id) { bits[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63); };
  if (s.can_continue()) {
    if (!tables || !tabled_walk(*tables, graph, trie, s, bits)) full_walk(graph, trie, s, bits);
    for (int32_t id : o.allowed_special)
      if (id >= 0 && static_cast<size_t>(id) < trie.vocab_size() && accepts_text(g, s, trie.text(id))) set(id);
  }
  const bool any = std::any_of(bits.begin(), bits.end(), [](uint64_t w) { return w != 0; });
  // EOS where the output is complete, and as the only way out of a dead end.
  if (s.accepting() || !any)
    for (int32_t id : o.eos_ids)
      if (id >= 0 && static_cast<size_t>(id) < trie.vocab_size()) set(id);
  return bits;
}

}  // namespace

// Allowed-token bitsets by grammar state, shared by every request of one compiled grammar (a schema sent again
// and again finds its masks computed), with the state graph their walks built.
struct GrammarConstraint::Shared {
  Shared(const Grammar& g, const TokenTrie& trie) : graph(g), tables(g, trie) {}
  std::mutex mu;
  StateGraph graph;
  TokenTables tables;
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
    // A word at a time: inside strings most words are all ones and cost one test; between values most are all
    // zeros and cost one fill.
    for (size_t w = 0; w * 64 < n; ++w) {
      const uint64_t word = bits[w];
      if (word == ~uint64_t{0}) continue;
      const size_t end = std::min(n, w * 64 + 64);
      if (word == 0) {
        std::fill(logits.begin() + static_cast<long>(w * 64), logits.begin() + static_cast<long>(end), kOff);
        continue;
      }
      for (size_t i = w * 64; i < end; ++i)
        if (!((word >> (i & 63)) & 1)) logits[i] = kOff;
    }
    for (size_t i = n; i < logits.size(); ++i) logits[i] = kOff;
  }

  void allowed_bits(size_t vocab, std::vector<uint64_t>& out) override {
    const size_t words = (vocab + 63) / 64;
    if (!active_) {
      out.assign(words, ~uint64_t{0});
      return;
    }
    load_bits();
    const std::vector<uint64_t>& bits = *bits_;
    // Tokens past the tokenizer's vocabulary (a padded embedding) are never allowed, as in mask().
    const size_t n = std::min(vocab, c_.trie().vocab_size());
    out.assign(words, 0);
    std::copy(bits.begin(), bits.begin() + static_cast<long>(n / 64), out.begin());
    if (n % 64) out[n / 64] = bits[n / 64] & ((uint64_t{1} << (n % 64)) - 1);
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
      auto bits = std::make_shared<const std::vector<uint64_t>>(mask_of(shared_.graph,
                                                                        c_.options().tables ? &shared_.tables : nullptr,
                                                                        c_.grammar(), c_.trie(), state_, c_.options()));
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

std::vector<char> allowed_tokens(const Grammar& g, const TokenTrie& trie, const StackSet& s, const ConstraintOptions& o,
                                 TokenTables* tables) {
  StateGraph graph(g);
  const std::vector<uint64_t> bits = mask_of(graph, tables, g, trie, s, o);
  std::vector<char> allowed(trie.vocab_size(), 0);
  for (size_t i = 0; i < allowed.size(); ++i) allowed[i] = static_cast<char>((bits[i >> 6] >> (i & 63)) & 1);
  return allowed;
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
      shared_(std::make_shared<Shared>(*grammar_, *trie_)) {}

std::unique_ptr<ConstraintState> GrammarConstraint::start() const {
  return std::make_unique<GrammarState>(*this, *shared_);
}

}  // namespace lathe::grammar
