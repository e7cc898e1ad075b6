// The BPE model: a word's characters are merged pairwise by merge rank (lowest first, leftmost on ties) into
// vocabulary tokens. Covers byte_fallback, unk (with fuse_unk), ignore_merges and the subword prefix/suffix.
#pragma once
#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/flat_index.h"
#include "tokenizer/json_at.h"
#include "tokenizer/tokenizer_json_reader.h"

namespace lathe {

// Hash for heterogeneous lookup: find a std::string key by std::string_view without building a string.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class Bpe {
 public:
  // tokenizer.json "model" with type BPE; vocab and merges come from `tables` where parse_tokenizer_json lifted
  // them out, else from the tree.
  explicit Bpe(const JsonAt& model, BpeTables tables = {});

  // Appends the ids of one pre-tokenized word.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(int32_t id) const;  // nullptr when the id has no token
  size_t vocab_size() const { return vocab_.size(); }
  int32_t max_id() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }
  // The vocabulary and merge tables as bytes, for the tokenizer cache (BpeTables::prebuilt reads them back).
  void save_index(std::string& out) const;

 private:
  using Merge = BpeMerge;
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;

  TokenIndex vocab_;
  std::vector<std::string> id_to_token_;
  PairIndex<Merge> merges_;
  std::array<int32_t, 256> byte_ids_{};  // "<0xXX>" tokens for byte_fallback, -1 where absent
  std::optional<int32_t> unk_id_;
  std::string prefix_;  // continuing_subword_prefix
  std::string suffix_;  // end_of_word_suffix
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;

  // Words seen before; most text repeats words, so this carries encode speed. Bounded, never evicted.
  mutable std::shared_mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace lathe
