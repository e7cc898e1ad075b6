// A pass over JSON text that builds nothing and enforces limits (nesting depth, keys per object, values in
// all) before a DOM parser sees it: nlohmann recurses over nested values when converting and its ordered_json
// checks duplicate keys linearly, so unchecked input could exhaust the stack or take quadratic time.
#pragma once
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace lathe::io {

struct JsonLimits {
  size_t max_depth;
  size_t max_object_keys;
  size_t max_values;
};

// Limits for request bodies, and for model files (tokenizer.json, config.json, safetensors headers).
JsonLimits request_json_limits();
JsonLimits file_json_limits();

// Empty when `text` is valid JSON within the limits; otherwise what is wrong (position included).
std::optional<std::string> check_json(std::string_view text, const JsonLimits& limits);

// Only the limits: empty for valid JSON within them and for invalid JSON (left to the caller's own parser,
// which reports syntax errors its way).
std::optional<std::string> check_json_limits(std::string_view text, const JsonLimits& limits);

// check_json, then parse; any failure throws Error(kind, what + ": " + reason).
nlohmann::json parse_json_checked(std::string_view text, const JsonLimits& limits, ErrorKind kind,
                                  const std::string& what);
nlohmann::ordered_json parse_ordered_json_checked(std::string_view text, const JsonLimits& limits, ErrorKind kind,
                                                  const std::string& what);

}  // namespace lathe::io
