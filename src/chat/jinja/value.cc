#include "chat/jinja/value.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <unordered_set>

#include "chat/jinja/budget.h"
#include "common/error.h"
#include "common/limits.h"

namespace lathe::jinja {
namespace {

thread_local int t_value_depth = 0;
// Containers whose last reference died while another release was draining on this thread (see ~Value).
thread_local std::vector<std::shared_ptr<void>>* t_dying = nullptr;

// The list or dict a value holds, as an identity; null for scalars and callables.
const void* container_of(const Value& v) {
  if (v.is_list()) return &v.list();
  if (v.is_dict()) return v.dict_ptr().get();
  return nullptr;
}

}  // namespace

ValueDepthGuard::ValueDepthGuard() {
  RenderBudget::step();  // a value shared many times over is walked as often: bound the time too
  if (++t_value_depth > limits::kJinjaMaxValueDepth) {
    --t_value_depth;
    throw Error(ErrorKind::InvalidArgument, "value nested deeper than " + std::to_string(limits::kJinjaMaxValueDepth) +
                                                " lists or dicts (or contains itself)");
  }
}

ValueDepthGuard::~ValueDepthGuard() { --t_value_depth; }

void check_insertable(const Value& container, const Value& inserted) {
  const void* target = container_of(container);
  if (!target || !container_of(inserted)) return;
  // Iterative and visiting each shared container once, so neither a deep nor a widely shared value costs more
  // than its distinct containers; each one visited is a render step.
  std::vector<const Value*> todo{&inserted};
  std::unordered_set<const void*> seen;
  while (!todo.empty()) {
    const Value* v = todo.back();
    todo.pop_back();
    const void* c = container_of(*v);
    if (!c || !seen.insert(c).second) continue;
    if (c == target)
      throw Error(ErrorKind::InvalidArgument, "cannot put a " + container.type_name() + " inside itself");
    RenderBudget::step();
    if (v->is_list()) {
      for (const Value& item : v->list()) todo.push_back(&item);
    } else {
      for (const auto& [k, item] : v->dict_ref().items) todo.push_back(&item);
    }
  }
}

Value::~Value() {
  if (is_list() || is_dict()) release_container();
}

void Value::release_container() noexcept {
  std::shared_ptr<void> last;
  if (is_list())
    last = std::move(std::get<std::shared_ptr<ValueList>>(data_));
  else
    last = std::move(std::get<std::shared_ptr<ValueDict>>(data_));
  if (last.use_count() != 1) return;  // not the last reference: dropping `last` only counts down
  if (t_dying) {
    // A release further up this thread's stack is draining: queue this one instead of recursing into it.
    try {
      t_dying->push_back(std::move(last));
    } catch (...) {
      // Out of memory for the queue: release in place (recursion, but only as deep as memory allowed).
    }
    return;
  }
  std::vector<std::shared_ptr<void>> dying;
  t_dying = &dying;
  last.reset();  // its elements' destructors queue their own containers
  while (!dying.empty()) {
    std::shared_ptr<void> next = std::move(dying.back());
    dying.pop_back();
    next.reset();
  }
  t_dying = nullptr;
}

const Value* ValueDict::find(const std::string& key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

Value* ValueDict::find(const std::string& key) {
  for (auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void ValueDict::set(const std::string& key, Value value) {
  if (Value* slot = find(key)) {
    *slot = std::move(value);
    return;
  }
  items.emplace_back(key, std::move(value));
}

const Value* CallArgs::get(size_t index, const std::string& name) const {
  if (index < positional.size()) return &positional[index];
  for (const auto& [k, v] : keywords)
    if (k == name) return &v;
  return nullptr;
}

std::string* Value::unshared_string() {
  if (!is_string()) return nullptr;
  std::shared_ptr<std::string>& s = std::get<std::shared_ptr<std::string>>(data_);
  return s.use_count() == 1 ? s.get() : nullptr;
}

Value Value::undefined(std::string hint) {
  Value v;
  v.data_ = UndefinedTag{std::move(hint)};
  return v;
}

Value Value::function(std::string name, std::function<Value(const CallArgs&)> fn) {
  return Value(std::make_shared<Callable>(Callable{std::move(name), std::move(fn)}));
}

double Value::number() const {
  switch (type()) {
    case Type::Bool: return as_bool() ? 1.0 : 0.0;
    case Type::Int: return static_cast<double>(as_int());
    case Type::Float: return as_float();
    default: throw Error(ErrorKind::InvalidArgument, "'" + type_name() + "' object is not a number");
  }
}

bool Value::truthy() const {
  switch (type()) {
    case Type::Undefined:
    case Type::None: return false;
    case Type::Bool: return as_bool();
    case Type::Int: return as_int() != 0;
    case Type::Float: return as_float() != 0.0;
    case Type::String: return !as_string().empty();
    case Type::List: return !list().empty();
    case Type::Dict: return is_namespace() || !dict_ref().items.empty();
    case Type::Callable: return true;
  }
  return false;
}

std::string Value::type_name() const {
  switch (type()) {
    case Type::Undefined: return "Undefined";
    case Type::None: return "NoneType";
    case Type::Bool: return "bool";
    case Type::Int: return "int";
    case Type::Float: return "float";
    case Type::String: return "str";
    case Type::List: return "list";
    case Type::Dict: return is_namespace() ? "Namespace" : "dict";
    case Type::Callable: return "function";
  }
  return "object";
}

std::string python_float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  // Shortest round-trip digits in scientific form, then laid out the way Python's repr does.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  const size_t e_pos = sci.find('e');
  std::string mantissa = sci.substr(0, e_pos);
  const int exponent = std::stoi(sci.substr(e_pos + 1));
  const bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa)
    if (c != '.') digits += c;
  std::string out;
  if (exponent < -4 || exponent >= 16) {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out.append(".").append(digits, 1, std::string::npos);
    char exp_buf[16];
    std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += exp_buf;
  } else if (exponent < 0) {
    out = "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
  } else {
    const size_t int_len = static_cast<size_t>(exponent) + 1;
    if (digits.size() <= int_len) {
      out = digits + std::string(int_len - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, int_len) + "." + digits.substr(int_len);
    }
  }
  return negative ? "-" + out : out;
}

namespace {

std::string repr_string(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == quote) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += quote;
  return out;
}

}  // namespace

std::string Value::str() const {
  switch (type()) {
    case Type::Undefined: return "";
    case Type::String: return as_string();
    default: return repr();
  }
}

std::string Value::repr() const {
  switch (type()) {
    case Type::Undefined: return "";
    case Type::None: return "None";
    case Type::Bool: return as_bool() ? "True" : "False";
    case Type::Int: return std::to_string(as_int());
    case Type::Float: return python_float_repr(as_float());
    case Type::String: return repr_string(as_string());
    case Type::List: {
      const ValueDepthGuard nest;
      std::string out = "[";
      bool first = true;
      for (const Value& item : list()) {
        if (!first) out += ", ";
        first = false;
        out += item.repr();
        RenderBudget::check_string(out.size(), "repr()");
      }
      return out + "]";
    }
    case Type::Dict: {
      const ValueDepthGuard nest;
      std::string out = is_namespace() ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, v] : dict_ref().items) {
        if (!first) out += ", ";
        first = false;
        out += repr_string(k) + ": " + v.repr();
        RenderBudget::check_string(out.size(), "repr()");
      }
      return out + (is_namespace() ? "}>" : "}");
    }
    case Type::Callable: return "<function " + callable().name + ">";
  }
  return "";
}

bool Value::operator==(const Value& other) const {
  if (is_number() && other.is_number()) {
    if (!is_float() && !other.is_float())
      return (is_bool() ? (as_bool() ? 1 : 0) : as_int()) ==
             (other.is_bool() ? (other.as_bool() ? 1 : 0) : other.as_int());
    return number() == other.number();
  }
  if (type() != other.type()) return false;
  switch (type()) {
    case Type::Undefined:
    case Type::None: return true;
    case Type::String: return as_string() == other.as_string();
    case Type::List: {
      const ValueList& a = list();
      const ValueList& b = other.list();
      if (&a == &b) return true;
      if (a.size() != b.size()) return false;
      const ValueDepthGuard nest;
      for (size_t i = 0; i < a.size(); ++i)
        if (!(a[i] == b[i])) return false;
      return true;
    }
    case Type::Dict: {
      if (is_namespace() || other.is_namespace() || dict_ptr() == other.dict_ptr())
        return dict_ptr() == other.dict_ptr();
      const ValueDepthGuard nest;
      const auto& a = dict_ref().items;
      if (a.size() != other.dict_ref().items.size()) return false;
      for (const auto& [k, v] : a) {
        const Value* ov = other.dict_ref().find(k);
        if (!ov || !(v == *ov)) return false;
      }
      return true;
    }
    case Type::Callable: return &callable() == &other.callable();
    default: return false;
  }
}

Value from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: return Value(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList items;
      items.reserve(j.size());
      for (const auto& item : j) items.push_back(from_json(item));
      return Value(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value d = Value::dict();
      for (const auto& [k, v] : j.items()) d.dict_ref().items.emplace_back(k, from_json(v));
      return d;
    }
    default: return Value::undefined();
  }
}

Value from_json(nlohmann::ordered_json&& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::string: return Value(std::move(j.get_ref<std::string&>()));
    case nlohmann::ordered_json::value_t::array: {
      ValueList items;
      items.reserve(j.size());
      for (auto& item : j) items.push_back(from_json(std::move(item)));
      return Value(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value d = Value::dict();
      for (auto it = j.begin(); it != j.end(); ++it)
        d.dict_ref().items.emplace_back(it.key(), from_json(std::move(it.value())));
      return d;
    }
    default: return from_json(static_cast<const nlohmann::ordered_json&>(j));
  }
}

namespace {

void json_string(const std::string& s, std::string& out) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

void json_dump(const Value& v, int indent, int depth, std::string& out) {
  auto newline = [&](int level) {
    out += '\n';
    out.append(static_cast<size_t>(indent * level), ' ');
  };
  switch (v.type()) {
    case Value::Type::None: out += "null"; return;
    case Value::Type::Bool: out += v.as_bool() ? "true" : "false"; return;
    case Value::Type::Int: out += std::to_string(v.as_int()); return;
    case Value::Type::Float: {
      const double f = v.as_float();
      if (std::isnan(f))
        out += "NaN";
      else if (std::isinf(f))
        out += f > 0 ? "Infinity" : "-Infinity";
      else
        out += python_float_repr(f);
      return;
    }
    case Value::Type::String: json_string(v.as_string(), out); return;
    case Value::Type::List: {
      const ValueDepthGuard nest;
      const ValueList& items = v.list();
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += indent >= 0 ? "," : ", ";
        if (indent >= 0) newline(depth + 1);
        json_dump(items[i], indent, depth + 1, out);
        RenderBudget::check_string(out.size(), "tojson");
      }
      if (indent >= 0) newline(depth);
      out += ']';
      return;
    }
    case Value::Type::Dict: {
      if (v.is_namespace()) break;
      const ValueDepthGuard nest;
      const auto& items = v.dict_ref().items;
      if (items.empty()) {
        out += "{}";
        return;
      }
      out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += indent >= 0 ? "," : ", ";
        if (indent >= 0) newline(depth + 1);
        json_string(items[i].first, out);
        out += ": ";
        json_dump(items[i].second, indent, depth + 1, out);
        RenderBudget::check_string(out.size(), "tojson");
      }
      if (indent >= 0) newline(depth);
      out += '}';
      return;
    }
    default: break;
  }
  throw Error(ErrorKind::InvalidArgument, "Object of type " + v.type_name() + " is not JSON serializable");
}

}  // namespace

std::string to_json(const Value& v, int indent) {
  std::string out;
  json_dump(v, indent, 0, out);
  return out;
}

}  // namespace lathe::jinja
