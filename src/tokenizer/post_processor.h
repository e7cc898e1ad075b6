// Post-processors: add the special tokens a model expects around an encoded sequence (when asked to).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "tokenizer/json_at.h"

namespace lathe {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  // Returns the ids with this processor's special tokens added around a single sequence.
  virtual std::vector<int32_t> process(std::vector<int32_t> ids) const = 0;
};

// Builds the post-processor described by `spec`; null JSON gives nullptr (nothing is added).
std::unique_ptr<PostProcessor> make_post_processor(const JsonAt& spec);

}  // namespace lathe
