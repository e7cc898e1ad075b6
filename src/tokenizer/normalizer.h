// Normalizers: rewrite text before it is split (tokenizer.json "normalizer").
#pragma once
#include <memory>
#include <string>

#include "tokenizer/json_at.h"

namespace lathe {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string normalize(std::string text) const = 0;
};

// Builds the normalizer described by `spec`; null JSON gives nullptr (no normalization).
std::unique_ptr<Normalizer> make_normalizer(const JsonAt& spec);

}  // namespace lathe
