// lathe::Tokenizer: HF tokenizer.json (BPE models) read by our own implementation. Encoding runs added-token
// extraction -> normalizer -> pre-tokenizer -> BPE -> post-processor; decoding runs the decoder chain.
// Thread-safe: encode/decode are const and may run concurrently.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/added_vocabulary.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/function_ref.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pre_tokenizer.h"

namespace lathe {

// Special-token settings from tokenizer_config.json (empty strings where the file does not name one).
struct SpecialTokensConfig {
  std::string bos_token, eos_token, pad_token, unk_token;
  bool add_bos_token = false;
  bool add_eos_token = false;
};

class Tokenizer {
 public:
  // Reads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json.
  static std::unique_ptr<Tokenizer> load(const std::filesystem::path& dir);
  // From the file contents; `config_json` may be empty.
  static std::unique_ptr<Tokenizer> from_json(std::string_view tokenizer_json, std::string_view config_json = {});

  // `add_special`: let the post-processor add its special tokens (e.g. Gemma's <bos>). Invalid UTF-8 in `text`
  // is replaced by U+FFFD first.
  std::vector<int32_t> encode(std::string_view text, bool add_special = false) const;
  // Encodes as encode(text) does (no special tokens added) but stores only the first `max_ids` ids in `ids`
  // (replacing its contents) and returns how many ids the whole text encodes to. `ids` never holds, nor reserves
  // room for, more than `max_ids`: a caller that refuses text past a limit learns its exact length in O(limit).
  size_t encode_capped(std::string_view text, size_t max_ids, std::vector<int32_t>& ids) const;
  // As encode(text, true), capped the same way: the count includes the post-processor's special tokens, and
  // `ids` holds encode(text, true)'s first ids when the whole count fits under `max_ids` (else the text's
  // first ids, which a caller refusing the prompt only counts).
  size_t encode_special_capped(std::string_view text, size_t max_ids, std::vector<int32_t>& ids) const;
  // Ids with no token are skipped; `skip_special` drops special added tokens.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;
  // One past the largest id of the model vocabulary and the added tokens (the embedding rows a model needs).
  size_t vocab_size() const { return vocab_size_; }

  const SpecialTokensConfig& special_tokens() const { return config_; }
  std::optional<int32_t> bos_id() const { return lookup(config_.bos_token); }
  std::optional<int32_t> eos_id() const { return lookup(config_.eos_token); }

 private:
  Tokenizer() = default;
  static std::unique_ptr<Tokenizer> from_parsed(TokenizerJson parsed, std::string_view config_json);
  std::optional<int32_t> lookup(const std::string& token) const;
  // The pipeline up to the model: added tokens go to `special`, the words between them (normalized and
  // pre-tokenized) to `word`, in order.
  void encode_pieces(std::string_view text, FunctionRef<void(int32_t)> special, WordSink word) const;

  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<Bpe> model_;
  std::unique_ptr<PostProcessor> post_processor_;
  std::unique_ptr<Decoder> decoder_;
  AddedVocabulary added_;
  SpecialTokensConfig config_;
  size_t vocab_size_ = 0;
};

}  // namespace lathe
