// The value type templates compute with: Python-like semantics (truthiness, equality, str/repr) because chat
// templates are written against Jinja2 running in Python. Lists and dicts are shared by reference, as in Python,
// so `ns.items.append(x)` mutates the list a namespace holds.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace lathe::jinja {

class Value;
using ValueList = std::vector<Value>;

// Insertion-ordered string-keyed map (Python dicts keep insertion order; tojson relies on it).
struct ValueDict {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;  // namespace() objects allow attribute assignment

  const Value* find(const std::string& key) const;
  Value* find(const std::string& key);
  void set(const std::string& key, Value value);
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keywords;

  // Argument `index` positionally, else keyword `name`, else nullptr.
  const Value* get(size_t index, const std::string& name) const;
};

struct Callable {
  std::string name;
  std::function<Value(const CallArgs&)> fn;
};

struct NoneTag {
  bool operator==(const NoneTag&) const = default;
};

// Walks into nested lists and dicts (repr, ==, tojson, comparisons) hold one of these per level: deeper than
// limits::kJinjaMaxValueDepth is an Error(InvalidArgument) rather than a stack overflow.
class ValueDepthGuard {
 public:
  ValueDepthGuard();
  ~ValueDepthGuard();
  ValueDepthGuard(const ValueDepthGuard&) = delete;
  ValueDepthGuard& operator=(const ValueDepthGuard&) = delete;
};

// Throws unless `inserted` can go into `container` (a list or dict) without the container containing itself:
// Python allows such cycles, but here they would leak and make every walk endless. The walk costs render steps.
void check_insertable(const Value& container, const Value& inserted);

class Value {
 public:
  enum class Type { Undefined, None, Bool, Int, Float, String, List, Dict, Callable };

  Value() = default;  // undefined
  // A value that drops the last reference to a list or dict releases its nested containers one at a time, so
  // a template's million-deep list cannot overflow the stack when it dies.
  ~Value();
  Value(const Value&) = default;
  Value(Value&&) noexcept = default;
  Value& operator=(const Value&) = default;
  Value& operator=(Value&&) noexcept = default;
  static Value undefined(std::string hint = {});
  static Value none() { return Value(NoneTag{}); }
  Value(bool b) : data_(b) {}
  Value(int v) : data_(static_cast<int64_t>(v)) {}
  Value(int64_t v) : data_(v) {}
  Value(double v) : data_(v) {}
  // Strings are immutable, as in Python, and shared: copying a Value (a variable read, an attribute, a loop
  // item) never copies a string's bytes, so a 16 MB message is held once however often the template names it.
  Value(std::string s) : data_(std::make_shared<std::string>(std::move(s))) {}
  Value(const char* s) : data_(std::make_shared<std::string>(s)) {}
  Value(ValueList list) : data_(std::make_shared<ValueList>(std::move(list))) {}
  Value(std::shared_ptr<ValueList> list) : data_(std::move(list)) {}
  Value(std::shared_ptr<ValueDict> dict) : data_(std::move(dict)) {}
  Value(std::shared_ptr<Callable> fn) : data_(std::move(fn)) {}
  static Value dict() { return Value(std::make_shared<ValueDict>()); }
  static Value function(std::string name, std::function<Value(const CallArgs&)> fn);

  Type type() const { return static_cast<Type>(data_.index()); }
  bool is_undefined() const { return type() == Type::Undefined; }
  bool is_none() const { return type() == Type::None; }
  bool is_bool() const { return type() == Type::Bool; }
  bool is_int() const { return type() == Type::Int; }
  bool is_float() const { return type() == Type::Float; }
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return type() == Type::String; }
  bool is_list() const { return type() == Type::List; }
  bool is_dict() const { return type() == Type::Dict; }
  bool is_callable() const { return type() == Type::Callable; }
  bool is_namespace() const { return is_dict() && dict_ptr()->is_namespace; }

  bool as_bool() const { return std::get<bool>(data_); }
  int64_t as_int() const { return std::get<int64_t>(data_); }
  double as_float() const { return std::get<double>(data_); }
  const std::string& as_string() const { return *std::get<std::shared_ptr<std::string>>(data_); }
  // The string's bytes to change in place, when this Value is the only one holding them (a temporary such as
  // the left side of `a + b + c`): appending then costs the appended bytes, not a copy of the whole. Else null.
  std::string* unshared_string();
  ValueList& list() const { return *std::get<std::shared_ptr<ValueList>>(data_); }
  ValueDict& dict_ref() const { return *dict_ptr(); }
  const std::shared_ptr<ValueDict>& dict_ptr() const { return std::get<std::shared_ptr<ValueDict>>(data_); }
  const Callable& callable() const { return *std::get<std::shared_ptr<Callable>>(data_); }
  const std::string& undefined_hint() const { return std::get<UndefinedTag>(data_).hint; }

  // Numeric view for arithmetic and comparison (bools count as 0/1, as in Python).
  double number() const;
  bool truthy() const;
  // Python's str() and repr().
  std::string str() const;
  std::string repr() const;
  // Python type name, for error messages ("NoneType", "str", "dict", ...).
  std::string type_name() const;

  bool operator==(const Value& other) const;

 private:
  void release_container() noexcept;

  struct UndefinedTag {
    std::string hint;
  };
  explicit Value(NoneTag t) : data_(t) {}
  std::variant<UndefinedTag, NoneTag, bool, int64_t, double, std::shared_ptr<std::string>, std::shared_ptr<ValueList>,
               std::shared_ptr<ValueDict>, std::shared_ptr<Callable>>
      data_;
};

// Python's repr() of a float (shortest round-trip digits; scientific outside 1e-4 <= |x| < 1e16).
std::string python_float_repr(double v);

// JSON <-> Value. Objects keep their key order. The rvalue form moves strings out of `j` instead of copying
// them (what is left of `j` holds empty strings).
Value from_json(const nlohmann::ordered_json& j);
Value from_json(nlohmann::ordered_json&& j);
// Python's json.dumps(value, ensure_ascii=False, indent=indent) as used by HF's tojson filter; indent < 0 means
// none (", " and ": " separators).
std::string to_json(const Value& v, int indent = -1);

}  // namespace lathe::jinja
