// Pre-tokenizers: split normalized text into the words the model encodes one by one.
#pragma once
#include <memory>
#include <string>
#include <string_view>

#include "tokenizer/function_ref.h"
#include "tokenizer/json_at.h"

namespace lathe {

using WordSink = FunctionRef<void(std::string_view)>;

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits `text` and passes each word to `emit`, in order. `at_text_start`: `text` begins at offset 0 of the
  // original input (Metaspace's prepend_scheme "first" only prepends there).
  virtual void split(std::string_view text, bool at_text_start, WordSink emit) const = 0;
};

// Builds the pre-tokenizer described by `spec`; null JSON gives nullptr (the whole text is one word).
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const JsonAt& spec);

}  // namespace lathe
