#include "chat/grammar/token_trie.h"

#include <algorithm>
#include <map>
#include <mutex>

#include "tokenizer/tokenizer.h"

namespace lathe::grammar {

bool utf8_to_code_points(const std::string& s, std::vector<uint32_t>& out) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + static_cast<size_t>(len) > s.size()) return false;
    uint32_t cp = len == 1 ? c : c & (0x7F >> len);
    for (int k = 1; k < len; ++k) {
      const unsigned char b = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
      if ((b & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (b & 0x3F);
    }
    out.push_back(cp);
    i += static_cast<size_t>(len);
  }
  return true;
}

std::shared_ptr<const TokenTrie> TokenTrie::build(const Tokenizer& tok) {
  auto t = std::make_shared<TokenTrie>();
  t->vocab_size_ = tok.vocab_size();
  t->text_.resize(t->vocab_size_);
  t->special_.assign(t->vocab_size_, 0);
  struct Node {
    std::vector<std::pair<uint32_t, uint32_t>> children;  // (code point, node), sorted
    std::vector<int32_t> tokens;                          // tokens whose text ends here
  };
  std::vector<Node> nodes(1);
  static const std::string kReplacement = "\xEF\xBF\xBD";
  for (size_t i = 0; i < t->vocab_size_; ++i) {
    const int32_t id = static_cast<int32_t>(i);
    if (!tok.id_to_token(id)) continue;
    const std::string text = tok.decode(std::span<const int32_t>(&id, 1), false);
    if (tok.is_special(id)) {
      t->special_[i] = 1;
      t->specials_.emplace_back(text, id);
      utf8_to_code_points(text, t->text_[i]);
      continue;
    }
    // A token that is only part of a character decodes to U+FFFD: it cannot be placed by a grammar over
    // characters, so it stays out (characters still come whole from the tokens that hold them).
    if (text.empty() || (text.find(kReplacement) != std::string::npos && *tok.id_to_token(id) != kReplacement))
      continue;
    std::vector<uint32_t> cps;
    if (!utf8_to_code_points(text, cps)) continue;
    uint32_t node = 0;
    for (uint32_t cp : cps) {
      auto& ch = nodes[node].children;
      auto it = std::lower_bound(ch.begin(), ch.end(), std::make_pair(cp, 0u),
                                 [](const auto& a, const auto& b) { return a.first < b.first; });
      if (it != ch.end() && it->first == cp) {
        node = it->second;
      } else {
        const uint32_t fresh = static_cast<uint32_t>(nodes.size());
        ch.insert(it, {cp, fresh});
        nodes.emplace_back();
        node = fresh;
      }
    }
    nodes[node].tokens.push_back(id);
    t->text_[i] = std::move(cps);
  }
  // Breadth-first renumbering: order[k] is the build node that becomes node k.
  Flat& f = t->flat_;
  std::vector<uint32_t> order{0};
  order.reserve(nodes.size());
  f.cp.assign(nodes.size(), 0);
  for (size_t k = 0; k < order.size(); ++k) {
    const Node& n = nodes[order[k]];
    f.child_at.push_back(static_cast<uint32_t>(order.size()));
    f.token_at.push_back(static_cast<uint32_t>(f.tokens.size()));
    f.tokens.insert(f.tokens.end(), n.tokens.begin(), n.tokens.end());
    for (const auto& [cp, child] : n.children) {
      f.cp[order.size()] = cp;
      order.push_back(child);
    }
  }
  f.child_at.push_back(static_cast<uint32_t>(order.size()));
  f.token_at.push_back(static_cast<uint32_t>(f.tokens.size()));
  return t;
}

std::shared_ptr<const TokenTrie> TokenTrie::of(const Tokenizer& tok) {
  static std::mutex mu;
  static std::map<const Tokenizer*, std::shared_ptr<const TokenTrie>> built;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = built[&tok];
  if (!slot) slot = build(tok);
  return slot;
}

int32_t TokenTrie::special_id(const std::string& content) const {
  for (const auto& [text, id] : specials_)
    if (text == content) return id;
  return -1;
}

}  // namespace lathe::grammar
