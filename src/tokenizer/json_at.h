// A JSON value paired with its path inside tokenizer.json, so every load error names the construct and where
// it sits (e.g. "tokenizer.json: pre_tokenizer.pretokenizers[1].pattern: ...").
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace lathe {

class JsonAt {
 public:
  JsonAt(const nlohmann::json& value, std::string path) : value_(&value), path_(std::move(path)) {}

  const nlohmann::json& value() const { return *value_; }
  const std::string& path() const { return path_; }

  bool has(const char* key) const;   // an object member that is present and not null
  JsonAt at(const char* key) const;  // required member
  JsonAt at(size_t index) const;
  size_t size() const;  // of an array; fails on anything else

  std::string str() const;
  std::string str(const char* key) const { return at(key).str(); }
  std::string str_or(const char* key, const std::string& fallback) const;
  bool boolean_or(const char* key, bool fallback) const;
  int64_t integer() const;
  int64_t integer_or(const char* key, int64_t fallback) const;

  [[noreturn]] void fail(const std::string& what) const;         // malformed: ErrorKind::Corrupt
  [[noreturn]] void unsupported(const std::string& what) const;  // well-formed but outside what lathe supports

 private:
  const nlohmann::json* value_;
  std::string path_;
};

}  // namespace lathe
