// Incremental detokenization for streaming generation: push ids one at a time and get back only text that is
// final. Text is held back while it ends in an incomplete UTF-8 sequence (a character split across byte-level
// tokens or a partial run of <0xXX> byte-fallback tokens), so no emitted chunk ever holds broken UTF-8.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace lathe {

class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = false)
      : tokenizer_(&tokenizer), skip_special_(skip_special) {}

  // Adds one id; returns the newly completed text (often empty while a character is still incomplete).
  std::string push(int32_t id);
  // Returns whatever is still held back (an unfinished byte sequence comes out as U+FFFD) and starts over.
  std::string finish();
  void reset();

 private:
  std::string emit(bool final);

  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::vector<int32_t> ids_;
  // ids_[prefix_, read_) decode to the text already emitted last time; decoding from prefix_ keeps the
  // context that decoders such as Metaspace need for the first token.
  size_t prefix_ = 0;
  size_t read_ = 0;
};

}  // namespace lathe
