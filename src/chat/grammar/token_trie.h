// The tokenizer's vocabulary as a trie over code points, built once per tokenizer: a grammar state's allowed
// tokens are found by one walk that advances the grammar along shared prefixes and drops a whole subtree as soon
// as the grammar rejects its prefix. Special tokens stay out of the trie (a grammar names the ones it allows).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace lathe {
class Tokenizer;
}

namespace lathe::grammar {

class TokenTrie {
 public:
  // Nodes numbered breadth first, so that a node's children are one contiguous, sorted run and the walk reads
  // memory in order (a node per heap allocation made it a cache miss per node). Node 0 is the root.
  struct Flat {
    std::vector<uint32_t> cp;        // per node: the code point on the edge into it
    std::vector<uint32_t> child_at;  // children of v: [child_at[v], child_at[v + 1])
    std::vector<uint32_t> token_at;  // tokens whose text ends at v: tokens[token_at[v], token_at[v + 1])
    std::vector<int32_t> tokens;
  };

  static std::shared_ptr<const TokenTrie> build(const Tokenizer& tok);
  // The trie of `tok`, built on first use and kept (a tokenizer lives as long as the server).
  static std::shared_ptr<const TokenTrie> of(const Tokenizer& tok);

  const Flat& flat() const { return flat_; }
  size_t vocab_size() const { return vocab_size_; }
  // The code points of token id (empty for tokens outside the trie).
  const std::vector<uint32_t>& text(int32_t id) const { return text_[static_cast<size_t>(id)]; }
  bool is_special(int32_t id) const { return special_[static_cast<size_t>(id)] != 0; }
  // A special token's id by its content, or -1.
  int32_t special_id(const std::string& content) const;

 private:
  Flat flat_;
  std::vector<std::vector<uint32_t>> text_;
  std::vector<char> special_;
  std::vector<std::pair<std::string, int32_t>> specials_;
  size_t vocab_size_ = 0;
};

// Decodes UTF-8 into code points; false on malformed input.
bool utf8_to_code_points(const std::string& s, std::vector<uint32_t>& out);

}  // namespace lathe::grammar
