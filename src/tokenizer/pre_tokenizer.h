// Pre-tokenizers: split normalized text into the words the model encodes one by one.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "tokenizer/json_at.h"

namespace lathe {

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits each piece further, in place. `at_text_start`: pieces[0] begins at offset 0 of the original input
  // (Metaspace's prepend_scheme "first" only prepends there).
  virtual void split(std::vector<std::string>& pieces, bool at_text_start) const = 0;
};

// Builds the pre-tokenizer described by `spec`; null JSON gives nullptr (the whole text is one word).
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const JsonAt& spec);

}  // namespace lathe
