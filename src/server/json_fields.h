// Typed, range-checked reads of optional request fields. Every failure is a 400 that names the field, so a
// client learns exactly what to fix; absent and null fields read as "not given".
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace lathe::server {

class JsonFields {
 public:
  // prefix is prepended to field names in messages (e.g. "messages[2].").
  explicit JsonFields(const nlohmann::ordered_json& object, std::string prefix = {});

  bool has(const char* name) const;
  std::optional<double> number(const char* name, double min, double max) const;
  std::optional<int64_t> integer(const char* name, int64_t min, int64_t max) const;
  std::optional<bool> boolean(const char* name) const;
  std::optional<std::string> string(const char* name) const;
  // The raw value when present and not null, after checking its JSON type ("object", "array").
  const nlohmann::ordered_json* object(const char* name) const;
  const nlohmann::ordered_json* array(const char* name) const;

 private:
  const nlohmann::ordered_json* get(const char* name) const;
  std::string field(const char* name) const { return prefix_ + name; }
  const nlohmann::ordered_json& j_;
  std::string prefix_;
};

// obj[key] as a string: `fallback` when absent or null, a 400 naming `field` when it is not a string.
std::string string_member(const nlohmann::ordered_json& obj, const char* key, const std::string& fallback,
                          const std::string& field);

// Parses a request body as a JSON object (400 with the parser's position otherwise).
nlohmann::ordered_json parse_json_body(const std::string& body);

}  // namespace lathe::server
