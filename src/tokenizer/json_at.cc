#include "tokenizer/json_at.h"

#include "common/error.h"

namespace lathe {

bool JsonAt::has(const char* key) const {
  return value_->is_object() && value_->contains(key) && !(*value_)[key].is_null();
}

JsonAt JsonAt::at(const char* key) const {
  if (!value_->is_object()) fail("expected an object");
  const auto it = value_->find(key);
  const std::string child = path_.empty() ? key : path_ + "." + key;
  if (it == value_->end() || it->is_null()) JsonAt(*value_, child).fail("missing");
  return JsonAt(*it, child);
}

JsonAt JsonAt::at(size_t index) const {
  if (!value_->is_array()) fail("expected an array");
  if (index >= value_->size()) fail("index " + std::to_string(index) + " out of range");
  return JsonAt((*value_)[index], path_ + "[" + std::to_string(index) + "]");
}

size_t JsonAt::size() const {
  if (!value_->is_array()) fail("expected an array");
  return value_->size();
}

std::string JsonAt::str() const {
  if (!value_->is_string()) fail("expected a string, found " + std::string(value_->type_name()));
  return value_->get<std::string>();
}

std::string JsonAt::str_or(const char* key, const std::string& fallback) const {
  return has(key) ? at(key).str() : fallback;
}

bool JsonAt::boolean_or(const char* key, bool fallback) const {
  if (!has(key)) return fallback;
  const JsonAt v = at(key);
  if (!v.value().is_boolean()) v.fail("expected a boolean, found " + std::string(v.value().type_name()));
  return v.value().get<bool>();
}

int64_t JsonAt::integer() const {
  if (!value_->is_number_integer()) fail("expected an integer, found " + std::string(value_->type_name()));
  return value_->get<int64_t>();
}

int64_t JsonAt::integer_or(const char* key, int64_t fallback) const { return has(key) ? at(key).integer() : fallback; }

void JsonAt::fail(const std::string& what) const {
  throw Error(ErrorKind::Corrupt, "tokenizer.json: " + (path_.empty() ? std::string("(root)") : path_) + ": " + what);
}

void JsonAt::unsupported(const std::string& what) const {
  throw Error(ErrorKind::Unsupported,
              "tokenizer.json: " + (path_.empty() ? std::string("(root)") : path_) + ": " + what);
}

}  // namespace lathe
