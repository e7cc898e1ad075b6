// Added tokens (tokenizer.json "added_tokens"): strings that are cut out of the input before the model sees it,
// matched leftmost-longest; `normalized` ones are matched on normalized text, the others on the raw input.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/json_at.h"
#include "tokenizer/normalizer.h"

namespace lathe {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;
  bool lstrip = false;       // also swallow whitespace to the left
  bool rstrip = false;       // also swallow whitespace to the right
  bool single_word = false;  // only match when not inside a word
  bool normalized = false;   // match against normalized text (its content is normalized too)
};

// A run of text (id < 0) or one added token. The text is a view into what was split (a 16 MB prompt is not
// copied piece by piece).
struct Segment {
  std::string_view text;
  int32_t id = -1;
};

class AddedVocabulary {
 public:
  AddedVocabulary() = default;
  AddedVocabulary(const JsonAt& list, const Normalizer* normalizer);

  // Cuts the tokens matched on raw text (normalized=false) out of `text`.
  std::vector<Segment> split_raw(std::string_view text) const { return raw_.split(text, tokens_); }
  // Cuts the tokens matched on normalized text (normalized=true) out of already normalized `text`.
  std::vector<Segment> split_normalized(std::string_view text) const { return normalized_.split(text, tokens_); }

  const AddedToken* find(int32_t id) const;
  std::optional<int32_t> token_to_id(std::string_view content) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }
  bool empty() const { return tokens_.empty(); }

 private:
  // A byte trie over token strings; the root is a direct table since most positions fail on their first byte.
  class Matcher {
   public:
    void add(const std::string& key, int32_t token_index);
    std::vector<Segment> split(std::string_view text, const std::vector<AddedToken>& tokens) const;

   private:
    struct Node {
      int32_t token = -1;
      std::vector<std::pair<uint8_t, int32_t>> children;
    };
    // Longest key starting at text[pos]: token index and end offset, or -1.
    int32_t longest_at(std::string_view text, size_t pos, size_t& end) const;
    std::vector<Node> nodes_{1};
  };

  std::vector<AddedToken> tokens_;
  std::unordered_map<int32_t, size_t> by_id_;
  std::unordered_map<std::string, int32_t> by_content_;
  Matcher raw_, normalized_;
};

}  // namespace lathe
