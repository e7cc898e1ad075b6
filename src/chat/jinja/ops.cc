#include "chat/jinja/ops.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "chat/jinja/budget.h"
#include "common/error.h"

namespace lathe::jinja {
namespace {

[[noreturn]] void type_error(const std::string& message) { throw Error(ErrorKind::InvalidArgument, message); }

std::string quoted_type(const Value& v) {
  std::string out(1, '\'');
  out += v.type_name();
  out += '\'';
  return out;
}

Value no_attribute(const Value& obj, const std::string& name) {
  std::string hint = quoted_type(obj);
  hint.insert(hint.size() - 1, " object");
  hint += " has no attribute '";
  hint += name;
  hint += '\'';
  return Value::undefined(hint);
}

[[noreturn]] Value overflow(const std::string& op) {
  throw Error(ErrorKind::InvalidArgument, "integer overflow in '" + op + "' (templates compute with 64-bit integers)");
}

bool is_integral(const Value& v) { return v.is_int() || v.is_bool(); }
int64_t integral(const Value& v) { return v.is_bool() ? (v.as_bool() ? 1 : 0) : v.as_int(); }

Value repeat(const Value& seq, int64_t times) {
  // Sized before building: 'a' * 10**10 must fail at once, not after exhausting memory.
  const size_t n = times > 0 ? static_cast<size_t>(times) : 0;
  if (seq.is_string()) {
    const size_t len = seq.as_string().size();
    RenderBudget::check_string(len != 0 && n > SIZE_MAX / len ? SIZE_MAX : len * n, "a repeated string");
    std::string out;
    for (int64_t i = 0; i < times; ++i) out += seq.as_string();
    return Value(out);
  }
  const size_t items = seq.list().size();
  RenderBudget::check_list(items != 0 && n > SIZE_MAX / items ? SIZE_MAX : items * n, "a repeated list");
  size_t bytes = 0;  // the strings the copies hold
  for (const Value& v : seq.list())
    if (v.is_string()) bytes += v.as_string().size();
  RenderBudget::check_string(bytes != 0 && n > SIZE_MAX / bytes ? SIZE_MAX : bytes * n, "a repeated list's strings");
  ValueList out;
  for (int64_t i = 0; i < times; ++i) out.insert(out.end(), seq.list().begin(), seq.list().end());
  return Value(std::move(out));
}

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  if (op == "+") {
    if (a.is_string() && b.is_string()) return Value(a.as_string() + b.as_string());
    if (a.is_list() && b.is_list()) {
      ValueList out = a.list();
      out.insert(out.end(), b.list().begin(), b.list().end());
      return Value(std::move(out));
    }
    if (a.is_string()) type_error("can only concatenate str (not \"" + b.type_name() + "\") to str");
    if (a.is_list()) type_error("can only concatenate list (not \"" + b.type_name() + "\") to list");
  }
  if (op == "*") {
    if ((a.is_string() || a.is_list()) && is_integral(b)) return repeat(a, integral(b));
    if ((b.is_string() || b.is_list()) && is_integral(a)) return repeat(b, integral(a));
  }
  if (!a.is_number() || !b.is_number())
    type_error("unsupported operand type(s) for " + op + ": " + quoted_type(a) + " and " + quoted_type(b));
  const bool ints = is_integral(a) && is_integral(b);
  if (ints) {
    const int64_t x = integral(a), y = integral(b);
    // Python's ints do not overflow; ours are 64-bit, and an overflow is an error rather than undefined.
    int64_t r = 0;
    if (op == "+") return __builtin_add_overflow(x, y, &r) ? overflow(op) : Value(r);
    if (op == "-") return __builtin_sub_overflow(x, y, &r) ? overflow(op) : Value(r);
    if (op == "*") return __builtin_mul_overflow(x, y, &r) ? overflow(op) : Value(r);
    if ((op == "//" || op == "%" || op == "/") && y == 0)
      type_error(op == "/" ? "division by zero" : "integer division or modulo by zero");
    if ((op == "//" || op == "%") && x == INT64_MIN && y == -1) return op == "%" ? Value(int64_t{0}) : overflow(op);
    if (op == "//") return Value(x / y - ((x % y != 0) && ((x < 0) != (y < 0)) ? 1 : 0));
    if (op == "%") {
      int64_t r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) r += y;
      return Value(r);
    }
    if (op == "**" && y >= 0) {
      // |x| >= 2 overflows int64 past 63 multiplications, so a huge exponent must not mean a huge loop.
      if (x == 0 || x == 1) return Value(y == 0 ? int64_t{1} : x);
      if (x == -1) return Value(y % 2 == 0 ? int64_t{1} : int64_t{-1});
      uint64_t r = 1;
      for (int64_t i = 0; i < std::min<int64_t>(y, 64); ++i) r *= static_cast<uint64_t>(x);
      return Value(static_cast<int64_t>(r));
    }
  }
  const double x = a.number(), y = b.number();
  if (op == "+") return Value(x + y);
  if (op == "-") return Value(x - y);
  if (op == "*") return Value(x * y);
  if (op == "**") return Value(std::pow(x, y));
  if (y == 0) type_error("float division by zero");
  if (op == "/") return Value(x / y);
  if (op == "//") return Value(std::floor(x / y));
  if (op == "%") {
    double r = std::fmod(x, y);
    if (r != 0 && ((r < 0) != (y < 0))) r += y;
    return Value(r);
  }
  type_error("unknown operator '" + op + "'");
}

}  // namespace

[[noreturn]] void throw_undefined(const Value& v) {
  throw Error(ErrorKind::InvalidArgument, v.undefined_hint().empty() ? "value is undefined" : v.undefined_hint());
}

std::vector<std::string> utf8_chars(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t len = 1;
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0xF0)
      len = 4;
    else if (c >= 0xE0)
      len = 3;
    else if (c >= 0xC0)
      len = 2;
    len = std::min(len, s.size() - i);
    out.push_back(s.substr(i, len));
    i += len;
  }
  return out;
}

size_t utf8_length(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

size_t length_of(const Value& v) {
  switch (v.type()) {
    case Value::Type::Undefined: return 0;
    case Value::Type::String: return utf8_length(v.as_string());
    case Value::Type::List: return v.list().size();
    case Value::Type::Dict: return v.dict_ref().items.size();
    default: type_error("object of type " + quoted_type(v) + " has no len()");
  }
}

ValueList iterate(const Value& v) {
  switch (v.type()) {
    case Value::Type::Undefined: return {};
    case Value::Type::List: return v.list();
    case Value::Type::Dict: {
      if (v.is_namespace()) break;
      ValueList keys;
      for (const auto& [k, unused] : v.dict_ref().items) keys.emplace_back(k);
      return keys;
    }
    case Value::Type::String: {
      ValueList chars;
      for (auto& c : utf8_chars(v.as_string())) chars.emplace_back(std::move(c));
      return chars;
    }
    default: break;
  }
  type_error(quoted_type(v) + " object is not iterable");
}

bool contains(const Value& container, const Value& item) {
  switch (container.type()) {
    case Value::Type::Undefined: return false;
    case Value::Type::String:
      if (!item.is_string()) type_error("'in <string>' requires string as left operand, not " + item.type_name());
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Type::List:
      for (const Value& v : container.list())
        if (v == item) return true;
      return false;
    case Value::Type::Dict:
      if (!item.is_string()) return false;
      return container.dict_ref().find(item.as_string()) != nullptr;
    default: type_error("argument of type " + quoted_type(container) + " is not iterable");
  }
}

int compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (is_integral(a) && is_integral(b)) return integral(a) < integral(b) ? -1 : integral(a) > integral(b) ? 1 : 0;
    const double x = a.number(), y = b.number();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list()) {
    const ValueDepthGuard nest;
    const ValueList &x = a.list(), &y = b.list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (x[i] == y[i]) continue;
      return compare(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  if (a.is_undefined()) throw_undefined(a);
  if (b.is_undefined()) throw_undefined(b);
  type_error("'<' not supported between instances of " + quoted_type(a) + " and " + quoted_type(b));
}

Value binary_op(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") return Value(a.str() + b.str());
  if (op == "<") return Value(compare(a, b) < 0);
  if (op == "<=") return Value(compare(a, b) <= 0);
  if (op == ">") return Value(compare(a, b) > 0);
  if (op == ">=") return Value(compare(a, b) >= 0);
  if (a.is_undefined()) throw_undefined(a);
  if (b.is_undefined()) throw_undefined(b);
  return arithmetic(op, a, b);
}

Value get_item(const Value& obj, const Value& key) {
  switch (obj.type()) {
    case Value::Type::Undefined: throw_undefined(obj);
    case Value::Type::Dict: {
      const std::string k = key.is_string() ? key.as_string() : key.str();
      if (const Value* v = obj.dict_ref().find(k)) return *v;
      return Value::undefined("'dict object' has no attribute '" + k + "'");
    }
    case Value::Type::List:
    case Value::Type::String: {
      if (!is_integral(key)) {
        if (key.is_string()) return get_attr(obj, key.as_string());
        type_error(obj.type_name() + " indices must be integers or slices, not " + key.type_name());
      }
      int64_t i = integral(key);
      if (obj.is_list()) {
        const int64_t n = static_cast<int64_t>(obj.list().size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Value::undefined("list object has no element " + std::to_string(integral(key)));
        return obj.list()[static_cast<size_t>(i)];
      }
      const auto chars = utf8_chars(obj.as_string());
      const int64_t n = static_cast<int64_t>(chars.size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined("str object has no element " + std::to_string(integral(key)));
      return Value(chars[static_cast<size_t>(i)]);
    }
    default: return no_attribute(obj, key.str());
  }
}

Value get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) throw_undefined(obj);
  if (obj.is_dict()) {
    if (const Value* v = obj.dict_ref().find(name)) return *v;
  }
  return no_attribute(obj, name);
}

Value slice(const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v) {
  if (obj.is_undefined()) throw_undefined(obj);
  auto bound = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    if (!is_integral(v)) type_error(std::string("slice ") + what + " must be an integer or None");
    return integral(v);
  };
  const int64_t step = bound(step_v, "step").value_or(1);
  if (step == 0) type_error("slice step cannot be zero");
  std::vector<std::string> chars;
  int64_t n = 0;
  if (obj.is_string()) {
    chars = utf8_chars(obj.as_string());
    n = static_cast<int64_t>(chars.size());
  } else if (obj.is_list()) {
    n = static_cast<int64_t>(obj.list().size());
  } else {
    type_error(quoted_type(obj) + " object is not subscriptable");
  }
  auto clamp = [&](std::optional<int64_t> v, int64_t fallback) {
    if (!v) return fallback;
    int64_t i = *v;
    if (i < 0) i += n;
    if (step > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t start = clamp(bound(start_v, "start"), step > 0 ? 0 : n - 1);
  const int64_t stop = clamp(bound(stop_v, "stop"), step > 0 ? n : -1);
  std::string out_s;
  ValueList out_l;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (obj.is_string())
      out_s += chars[static_cast<size_t>(i)];
    else
      out_l.push_back(obj.list()[static_cast<size_t>(i)]);
  }
  return obj.is_string() ? Value(std::move(out_s)) : Value(std::move(out_l));
}

}  // namespace lathe::jinja
