// A compiled PCRE2 regex in UTF + Unicode-properties mode (\p{L}, \s as Unicode), JIT-compiled when available.
// Thread-safe to share: each search allocates its own match data.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/function_ref.h"

namespace lathe {

class Regex {
 public:
  // Throws Error(Corrupt) naming `where` and the offset of the syntax error inside the pattern.
  Regex(const std::string& pattern, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Every non-overlapping match, left to right, as [begin, end) byte offsets. An empty match advances one
  // character so the scan always terminates.
  void for_each_match(std::string_view text, FunctionRef<void(size_t begin, size_t end)> fn) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string pattern_;
};

}  // namespace lathe
