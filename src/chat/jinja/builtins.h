// Registries of the filters (`x | name`), tests (`x is name`) and methods (`x.name()`) templates may use, plus
// the Python string helpers several of them share.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "chat/jinja/value.h"

namespace lathe::jinja {

using FilterFn = Value (*)(const Value& input, const CallArgs& args);
using TestFn = bool (*)(const Value& value, const CallArgs& args);

// nullptr when no filter/test has that name.
FilterFn find_filter(const std::string& name);
TestFn find_test(const std::string& name);
// Python/Jinja methods on str, list and dict values; nullopt when `obj` has no such method.
std::optional<Value> call_method(const Value& obj, const std::string& name, const CallArgs& args);

// Python str methods on UTF-8 text (case mapping is ASCII-only).
std::string py_strip(const std::string& s, const Value* chars, bool left, bool right);
std::vector<std::string> py_split(const std::string& s, const Value* sep, int64_t maxsplit);
std::string py_lower(std::string s);
std::string py_upper(std::string s);
std::string py_title(const std::string& s);
std::string py_capitalize(const std::string& s);
std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count);

}  // namespace lathe::jinja
