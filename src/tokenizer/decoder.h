// Decoders: turn the token strings of an id sequence back into text (tokenizer.json "decoder").
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "tokenizer/json_at.h"

namespace lathe {

class Decoder {
 public:
  virtual ~Decoder() = default;
  // One stage of the chain: token strings in, token strings out (the final text is their concatenation).
  virtual std::vector<std::string> decode_chain(std::vector<std::string> tokens) const = 0;
};

// Builds the decoder described by `spec`; null JSON gives nullptr.
std::unique_ptr<Decoder> make_decoder(const JsonAt& spec);

}  // namespace lathe
