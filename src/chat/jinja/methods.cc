// Methods templates call on values (`text.strip()`, `d.items()`, `ns.list.append(x)`), with Python semantics.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>

#include "chat/jinja/builtins.h"
#include "chat/jinja/ops.h"
#include "common/error.h"

namespace lathe::jinja {
namespace {

[[noreturn]] void bad_args(const std::string& method) {
  throw Error(ErrorKind::InvalidArgument, "bad arguments to method '" + method + "'");
}

const Value& required(const CallArgs& args, size_t index, const std::string& name, const std::string& method) {
  const Value* v = args.get(index, name);
  if (!v) bad_args(method);
  return *v;
}

const std::string& required_string(const CallArgs& args, size_t index, const std::string& name,
                                   const std::string& method) {
  const Value& v = required(args, index, name, method);
  if (!v.is_string()) throw Error(ErrorKind::InvalidArgument, method + "() argument must be str, not " + v.type_name());
  return v.as_string();
}

int64_t optional_int(const CallArgs& args, size_t index, const std::string& name, int64_t fallback) {
  const Value* v = args.get(index, name);
  if (!v || v->is_none()) return fallback;
  if (!v->is_int()) throw Error(ErrorKind::InvalidArgument, "'" + v->type_name() + "' object cannot be an integer");
  return v->as_int();
}

Value string_list(const std::vector<std::string>& parts) {
  ValueList out;
  for (const auto& p : parts) out.emplace_back(p);
  return Value(std::move(out));
}

bool affix_match(const std::string& s, const Value& affix, bool prefix, const std::string& method) {
  auto one = [&](const Value& a) {
    if (!a.is_string()) throw Error(ErrorKind::InvalidArgument, method + " first arg must be str or a tuple of str");
    const std::string& x = a.as_string();
    if (x.size() > s.size()) return false;
    return prefix ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (affix.is_list()) {
    for (const Value& a : affix.list())
      if (one(a)) return true;
    return false;
  }
  return one(affix);
}

// str.format with {} / {0} / {name} fields (no format specs beyond an empty one).
std::string py_format(const std::string& fmt, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '{' && i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
    } else if (c == '}' && i + 1 < fmt.size() && fmt[i + 1] == '}') {
      out += '}';
      ++i;
    } else if (c == '{') {
      const size_t close = fmt.find('}', i);
      if (close == std::string::npos)
        throw Error(ErrorKind::InvalidArgument, "Single '{' encountered in format string");
      std::string field = fmt.substr(i + 1, close - i - 1);
      if (const size_t colon = field.find(':'); colon != std::string::npos) field.resize(colon);
      const Value* v = nullptr;
      if (field.empty()) {
        v = args.get(auto_index++, "");
      } else if (std::isdigit(static_cast<unsigned char>(field[0]))) {
        size_t index = 0;
        const auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), index);
        if (ec == std::errc() && end == field.data() + field.size()) v = args.get(index, "");
      } else {
        v = args.get(SIZE_MAX, field);
      }
      if (!v) throw Error(ErrorKind::InvalidArgument, "format field '" + field + "' has no argument");
      out += v->str();
      i = close;
    } else {
      out += c;
    }
  }
  return out;
}

std::optional<Value> string_method(const std::string& s, const std::string& name, const CallArgs& args) {
  if (name == "strip") return Value(py_strip(s, args.get(0, "chars"), true, true));
  if (name == "lstrip") return Value(py_strip(s, args.get(0, "chars"), true, false));
  if (name == "rstrip") return Value(py_strip(s, args.get(0, "chars"), false, true));
  if (name == "split") return string_list(py_split(s, args.get(0, "sep"), optional_int(args, 1, "maxsplit", -1)));
  if (name == "splitlines") {
    std::vector<std::string> lines;
    size_t start = 0;
    for (size_t i = 0; i < s.size(); ++i)
      if (s[i] == '\n') {
        lines.push_back(s.substr(start, i - start));
        start = i + 1;
      }
    if (start < s.size()) lines.push_back(s.substr(start));
    return string_list(lines);
  }
  if (name == "startswith") return Value(affix_match(s, required(args, 0, "prefix", name), true, name));
  if (name == "endswith") return Value(affix_match(s, required(args, 0, "suffix", name), false, name));
  if (name == "upper") return Value(py_upper(s));
  if (name == "lower") return Value(py_lower(s));
  if (name == "title") return Value(py_title(s));
  if (name == "capitalize") return Value(py_capitalize(s));
  if (name == "replace")
    return Value(py_replace(s, required_string(args, 0, "old", name), required_string(args, 1, "new", name),
                            optional_int(args, 2, "count", -1)));
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    const std::string& sub = required_string(args, 0, "sub", name);
    const size_t at = name[0] == 'r' || name == "rindex" ? s.rfind(sub) : s.find(sub);
    if (at == std::string::npos) {
      if (name.find("index") != std::string::npos) throw Error(ErrorKind::InvalidArgument, "substring not found");
      return Value(static_cast<int64_t>(-1));
    }
    return Value(static_cast<int64_t>(utf8_length(s.substr(0, at))));
  }
  if (name == "count") {
    const std::string& sub = required_string(args, 0, "sub", name);
    if (sub.empty()) return Value(static_cast<int64_t>(utf8_length(s) + 1));
    int64_t n = 0;
    for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
    return Value(n);
  }
  if (name == "join") {
    std::string out;
    bool first = true;
    for (const Value& v : iterate(required(args, 0, "iterable", name))) {
      if (!first) out += s;
      first = false;
      out += v.str();
    }
    return Value(out);
  }
  if (name == "format") return Value(py_format(s, args));
  auto all_chars = [&](auto pred) {
    if (s.empty()) return Value(false);
    for (unsigned char c : s)
      if (!pred(c)) return Value(false);
    return Value(true);
  };
  if (name == "isdigit") return all_chars([](unsigned char c) { return std::isdigit(c) != 0; });
  if (name == "isalpha") return all_chars([](unsigned char c) { return std::isalpha(c) != 0; });
  if (name == "isalnum") return all_chars([](unsigned char c) { return std::isalnum(c) != 0; });
  if (name == "isspace") return all_chars([](unsigned char c) { return std::isspace(c) != 0; });
  if (name == "islower") return Value(py_lower(s) == s && py_upper(s) != s);
  if (name == "isupper") return Value(py_upper(s) == s && py_lower(s) != s);
  return std::nullopt;
}

std::optional<Value> dict_method(const Value& obj, const std::string& name, const CallArgs& args) {
  ValueDict& d = obj.dict_ref();
  if (name == "items") {
    ValueList out;
    for (const auto& [k, v] : d.items) out.emplace_back(ValueList{Value(k), v});
    return Value(std::move(out));
  }
  if (name == "keys") {
    ValueList out;
    for (const auto& [k, unused] : d.items) out.emplace_back(k);
    return Value(std::move(out));
  }
  if (name == "values") {
    ValueList out;
    for (const auto& [unused, v] : d.items) out.push_back(v);
    return Value(std::move(out));
  }
  if (name == "get") {
    const Value& key = required(args, 0, "key", name);
    if (key.is_string())
      if (const Value* v = d.find(key.as_string())) return *v;
    const Value* fallback = args.get(1, "default");
    return fallback ? *fallback : Value::none();
  }
  if (name == "copy") {
    Value copy = Value::dict();
    copy.dict_ref().items = d.items;
    return copy;
  }
  if (name == "update") {
    std::vector<std::pair<std::string, Value>> updates;
    if (const Value* other = args.get(0, ""); other && other->is_dict()) updates = other->dict_ref().items;
    updates.insert(updates.end(), args.keywords.begin(), args.keywords.end());
    for (const auto& [k, v] : updates) check_insertable(obj, v);
    for (const auto& [k, v] : updates) d.set(k, v);
    return Value::none();
  }
  if (name == "pop" || name == "setdefault") {
    const std::string key = required(args, 0, "key", name).str();
    const Value* fallback = args.get(1, "default");
    for (auto it = d.items.begin(); it != d.items.end(); ++it) {
      if (it->first != key) continue;
      Value v = it->second;
      if (name == "pop") d.items.erase(it);
      return v;
    }
    if (name == "setdefault") {
      if (fallback) check_insertable(obj, *fallback);
      d.set(key, fallback ? *fallback : Value::none());
      return fallback ? *fallback : Value::none();
    }
    if (!fallback) throw Error(ErrorKind::InvalidArgument, "KeyError: '" + key + "'");
    return *fallback;
  }
  return std::nullopt;
}

std::optional<Value> list_method(const Value& obj, const std::string& name, const CallArgs& args) {
  ValueList& l = obj.list();
  if (name == "append") {
    check_insertable(obj, required(args, 0, "object", name));
    l.push_back(required(args, 0, "object", name));
    return Value::none();
  }
  if (name == "extend") {
    const ValueList items = iterate(required(args, 0, "iterable", name));
    for (const Value& v : items) check_insertable(obj, v);
    for (const Value& v : items) l.push_back(v);
    return Value::none();
  }
  if (name == "pop" || name == "insert") {
    const int64_t n = static_cast<int64_t>(l.size());
    int64_t i = optional_int(args, 0, "index", name == "pop" ? -1 : 0);
    if (i < 0) i += n;
    if (name == "insert") {
      i = std::clamp<int64_t>(i, 0, n);
      check_insertable(obj, required(args, 1, "object", name));
      l.insert(l.begin() + i, required(args, 1, "object", name));
      return Value::none();
    }
    if (i < 0 || i >= n) throw Error(ErrorKind::InvalidArgument, n ? "pop index out of range" : "pop from empty list");
    Value v = l[static_cast<size_t>(i)];
    l.erase(l.begin() + i);
    return v;
  }
  if (name == "index" || name == "count") {
    const Value& x = required(args, 0, "value", name);
    int64_t count = 0;
    for (size_t i = 0; i < l.size(); ++i) {
      if (!(l[i] == x)) continue;
      if (name == "index") return Value(static_cast<int64_t>(i));
      ++count;
    }
    if (name == "index") throw Error(ErrorKind::InvalidArgument, x.repr() + " is not in list");
    return Value(count);
  }
  if (name == "copy") return Value(ValueList(l));
  if (name == "reverse") {
    std::reverse(l.begin(), l.end());
    return Value::none();
  }
  return std::nullopt;
}

}  // namespace

std::optional<Value> call_method(const Value& obj, const std::string& name, const CallArgs& args) {
  if (obj.is_string()) return string_method(obj.as_string(), name, args);
  if (obj.is_dict() && !obj.is_namespace()) return dict_method(obj, name, args);
  if (obj.is_list()) return list_method(obj, name, args);
  return std::nullopt;
}

}  // namespace lathe::jinja
