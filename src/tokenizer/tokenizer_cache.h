// A binary image of a large tokenizer.json's parsed form, so a server restart does not re-lex and re-hash a
// 10 MB file: the vocabulary and merge tables as built, plus the (small) rest of the JSON. Kept under
// $LATHE_CACHE_DIR, else $XDG_CACHE_HOME/lathe, else ~/.cache/lathe (`tokenizers/`), keyed by the file's path,
// size and modification time, and checked field by field on load: a stale, damaged or foreign image is ignored
// and rewritten, never trusted. LATHE_CACHE_DIR=off disables it.
#pragma once
#include <filesystem>
#include <optional>
#include <string>

#include "tokenizer/flat_index.h"

namespace lathe {

// Only files at least this large are worth an image.
constexpr uintmax_t kTokenizerCacheMinBytes = uintmax_t{1} << 20;

struct CachedTokenizer {
  std::string rest_json;  // tokenizer.json without the vocabulary and merges
  BpeIndex index;
};

std::optional<CachedTokenizer> read_tokenizer_cache(const std::filesystem::path& tokenizer_json);
// Best effort: failures (read-only home, full disk) are logged at debug level and otherwise ignored.
void write_tokenizer_cache(const std::filesystem::path& tokenizer_json, const std::string& rest_json,
                           const std::string& index_image);

}  // namespace lathe
