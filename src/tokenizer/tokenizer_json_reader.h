// Parses tokenizer.json with the BPE vocabulary and merges lifted out while parsing: a real tokenizer has
// 100k+ of each, and building them as a JSON tree (then walking and freeing it) was most of the load time.
// Everything else in the file becomes an ordinary JSON tree; the two lifted members stay in it as empty
// containers so the rest of the loader still sees their shape.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/flat_index.h"

namespace lathe {

struct BpeTables {
  bool vocab_captured = false;   // model.vocab was an object and its entries are in `vocab`
  bool merges_captured = false;  // model.merges was an array and its entries are in `merges`
  std::vector<std::pair<std::string, int64_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  // The first malformed entry: its path (e.g. model.merges[3]) and what is wrong with it.
  std::string error_path, error;
  // Tables read back from the tokenizer cache: used instead of vocab/merges when set.
  std::optional<BpeIndex> prebuilt;
};

struct TokenizerJson {
  nlohmann::json doc;
  BpeTables tables;
};

// Throws Error(Corrupt) on JSON syntax errors.
TokenizerJson parse_tokenizer_json(std::string_view text);

}  // namespace lathe
