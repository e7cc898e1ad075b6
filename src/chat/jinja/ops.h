// Python semantics shared by the evaluator, filters and methods: iteration, membership, operators, item and
// attribute lookup, slicing, and UTF-8 code point handling (Python strings index by code point).
#pragma once
#include <string>
#include <vector>

#include "chat/jinja/value.h"

namespace lathe::jinja {

// The items a `for` loop visits: list items, dict keys, string characters; undefined is empty.
ValueList iterate(const Value& v);
// Python's `item in container`.
bool contains(const Value& container, const Value& item);
// Binary operators: + - * / // % ** ~ < <= > >=.
Value binary_op(const std::string& op, const Value& a, const Value& b);
// Python ordering for sorting and min/max (numbers, strings, lists); throws on mixed types.
int compare(const Value& a, const Value& b);
// Jinja's a[b] and a.b: a missing entry is undefined (with a hint for the error if it is used further).
Value get_item(const Value& obj, const Value& key);
Value get_attr(const Value& obj, const std::string& name);
// Python's a[start:stop:step]; null bounds are passed as undefined.
Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
// Throws the error Jinja raises when an undefined value is used (attribute access, arithmetic, ...).
[[noreturn]] void throw_undefined(const Value& v);

// The UTF-8 string split into code points (each a short string).
std::vector<std::string> utf8_chars(const std::string& s);
size_t utf8_length(const std::string& s);
// Value length as Python's len(): code points, items or keys.
size_t length_of(const Value& v);

}  // namespace lathe::jinja
