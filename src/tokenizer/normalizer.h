// Normalizers: rewrite text before it is split (tokenizer.json "normalizer").
#pragma once
#include <memory>
#include <string>
#include <string_view>

#include "tokenizer/json_at.h"

namespace lathe {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string normalize(std::string text) const = 0;
  // True when normalize(text) is certainly `text` itself, so the caller need not copy it to ask.
  virtual bool leaves_unchanged(std::string_view) const { return false; }
};

// Builds the normalizer described by `spec`; null JSON gives nullptr (no normalization).
std::unique_ptr<Normalizer> make_normalizer(const JsonAt& spec);

}  // namespace lathe
