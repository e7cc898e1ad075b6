// Jinja2's built-in filters (the subset chat templates use), plus HF's tojson: json.dumps with
// ensure_ascii=False, insertion key order and optional indent.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>

#include "chat/jinja/budget.h"
#include "chat/jinja/builtins.h"
#include "chat/jinja/ops.h"
#include "common/error.h"

namespace lathe::jinja {
namespace {

[[noreturn]] void filter_error(const std::string& message) { throw Error(ErrorKind::InvalidArgument, message); }

bool flag(const CallArgs& args, size_t index, const std::string& name, bool fallback = false) {
  const Value* v = args.get(index, name);
  return v ? v->truthy() : fallback;
}

// Dotted attribute paths ("function.name") and integer parts, as Jinja's make_attrgetter resolves them.
Value attribute_of(const Value& item, const Value& attribute) {
  if (attribute.is_int()) return get_item(item, attribute);
  Value cur = item;
  const Value dot(".");
  for (const std::string& part : py_split(attribute.str(), &dot, -1)) {
    if (cur.is_undefined()) return cur;
    int64_t index = 0;
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), index);
    const bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    if (numeric && ec != std::errc()) return Value::undefined("no item " + part);  // beyond int64: no such index
    cur = numeric && end == part.data() + part.size() ? get_item(cur, Value(index)) : get_item(cur, Value(part));
  }
  return cur;
}

// Sort key with Jinja's default case-insensitive comparison of strings.
Value sort_key(const Value& v, bool case_sensitive) {
  return (!case_sensitive && v.is_string()) ? Value(py_lower(v.as_string())) : v;
}

Value f_abs(const Value& in, const CallArgs&) {
  if (in.is_int() && in.as_int() == INT64_MIN) throw Error(ErrorKind::InvalidArgument, "integer overflow in abs");
  if (in.is_int()) return Value(in.as_int() < 0 ? -in.as_int() : in.as_int());
  return Value(std::fabs(in.number()));
}

Value f_attr(const Value& in, const CallArgs& args) {
  const Value* name = args.get(0, "name");
  return name ? get_attr(in, name->str()) : Value::undefined();
}

Value f_capitalize(const Value& in, const CallArgs&) { return Value(py_capitalize(in.str())); }

Value f_default(const Value& in, const CallArgs& args) {
  const Value* fallback = args.get(0, "default_value");
  const bool boolean = flag(args, 1, "boolean");
  if (in.is_undefined() || (boolean && !in.truthy())) return fallback ? *fallback : Value("");
  return in;
}

Value f_dictsort(const Value& in, const CallArgs& args) {
  if (!in.is_dict()) filter_error("dictsort filter needs a mapping, got " + in.type_name());
  const bool case_sensitive = flag(args, 0, "case_sensitive");
  const Value* by = args.get(1, "by");
  const bool by_value = by && by->str() == "value";
  const bool reverse = flag(args, 2, "reverse");
  auto items = in.dict_ref().items;
  std::stable_sort(items.begin(), items.end(), [&](const auto& a, const auto& b) {
    const Value ka = sort_key(by_value ? a.second : Value(a.first), case_sensitive);
    const Value kb = sort_key(by_value ? b.second : Value(b.first), case_sensitive);
    return reverse ? compare(kb, ka) < 0 : compare(ka, kb) < 0;
  });
  ValueList out;
  for (auto& [k, v] : items) out.emplace_back(ValueList{Value(k), v});
  return Value(std::move(out));
}

Value f_escape(const Value& in, const CallArgs&) {
  std::string out;
  for (char c : in.str()) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return Value(out);
}

Value f_first(const Value& in, const CallArgs&) {
  ValueList items = iterate(in);
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}

Value f_last(const Value& in, const CallArgs&) {
  ValueList items = iterate(in);
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}

Value f_float(const Value& in, const CallArgs& args) {
  const Value* fallback = args.get(0, "default");
  if (in.is_number()) return Value(in.number());
  if (in.is_string()) {
    try {
      size_t used = 0;
      const double d = std::stod(in.as_string(), &used);
      if (used == py_strip(in.as_string(), nullptr, false, true).size()) return Value(d);
    } catch (const std::exception&) {
    }
  }
  return fallback ? *fallback : Value(0.0);
}

// A float truncated to an integer; NaN and values beyond int64 are errors (the cast would be undefined).
int64_t truncate_float(double d) {
  if (!(d > -9.2e18 && d < 9.2e18))
    throw Error(ErrorKind::InvalidArgument, "cannot convert float " + std::to_string(d) + " to integer");
  return static_cast<int64_t>(d);
}

Value f_int(const Value& in, const CallArgs& args) {
  const Value* fallback = args.get(0, "default");
  if (in.is_int()) return in;
  if (in.is_bool()) return Value(static_cast<int64_t>(in.as_bool()));
  if (in.is_float()) return Value(truncate_float(in.as_float()));
  if (in.is_string()) {
    const std::string s = py_strip(in.as_string(), nullptr, true, true);
    try {
      size_t used = 0;
      const long long v = std::stoll(s, &used, 10);
      if (used == s.size()) return Value(static_cast<int64_t>(v));
      const double d = std::stod(s, &used);
      if (used == s.size()) return Value(truncate_float(d));
    } catch (const std::exception&) {
    }
  }
  return fallback ? *fallback : Value(static_cast<int64_t>(0));
}

Value f_indent(const Value& in, const CallArgs& args) {
  const Value* width = args.get(0, "width");
  const double w = width && !width->is_string() ? width->number() : 4;
  if (!(w >= 0 && w <= 1024)) throw Error(ErrorKind::InvalidArgument, "indent width must be between 0 and 1024");
  const std::string pad = width && width->is_string() ? width->as_string() : std::string(static_cast<size_t>(w), ' ');
  const bool first = flag(args, 1, "first");
  const bool blank = flag(args, 2, "blank");
  // Jinja appends "\n" before splitlines(), so a trailing newline yields a final empty line.
  const std::string s = in.str() + "\n";
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i)
    if (s[i] == '\n') {
      lines.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  std::string out = lines.empty() ? "" : lines[0];
  for (size_t i = 1; i < lines.size(); ++i) {
    out += '\n';
    if (blank || !lines[i].empty()) out += pad;
    out += lines[i];
  }
  return Value(first ? pad + out : out);
}

Value f_items(const Value& in, const CallArgs& args) {
  if (in.is_undefined()) return Value(ValueList{});
  if (!in.is_dict()) filter_error("items filter needs a mapping, got " + in.type_name());
  return *call_method(in, "items", args);
}

Value f_join(const Value& in, const CallArgs& args) {
  const Value* sep = args.get(0, "d");
  const Value* attribute = args.get(1, "attribute");
  std::string out;
  bool first = true;
  for (const Value& v : iterate(in)) {
    if (!first && sep) out += sep->str();
    first = false;
    out += (attribute ? attribute_of(v, *attribute) : v).str();
  }
  return Value(out);
}

Value f_length(const Value& in, const CallArgs&) { return Value(static_cast<int64_t>(length_of(in))); }
Value f_list(const Value& in, const CallArgs&) { return Value(iterate(in)); }
Value f_lower(const Value& in, const CallArgs&) { return Value(py_lower(in.str())); }
Value f_upper(const Value& in, const CallArgs&) { return Value(py_upper(in.str())); }
Value f_title(const Value& in, const CallArgs&) { return Value(py_title(in.str())); }
Value f_string(const Value& in, const CallArgs&) { return Value(in.str()); }
Value f_safe(const Value& in, const CallArgs&) { return in; }

Value f_map(const Value& in, const CallArgs& args) {
  ValueList out;
  const Value* attribute = args.get(SIZE_MAX, "attribute");
  if (attribute) {
    const Value* fallback = args.get(SIZE_MAX, "default");
    for (const Value& v : iterate(in)) {
      Value got = attribute_of(v, *attribute);
      out.push_back(got.is_undefined() && fallback ? *fallback : got);
    }
    return Value(std::move(out));
  }
  if (args.positional.empty()) filter_error("map filter needs a filter name or attribute=");
  const std::string name = args.positional[0].str();
  const FilterFn fn = find_filter(name);
  if (!fn) filter_error("map: no filter named '" + name + "'");
  CallArgs rest{{args.positional.begin() + 1, args.positional.end()}, args.keywords};
  for (const Value& v : iterate(in)) out.push_back(fn(v, rest));
  return Value(std::move(out));
}

Value extreme(const Value& in, const CallArgs& args, bool want_max) {
  const bool case_sensitive = flag(args, 0, "case_sensitive");
  const Value* attribute = args.get(1, "attribute");
  ValueList items = iterate(in);
  if (items.empty()) return Value::undefined(std::string("No aggregated item, sequence was empty."));
  size_t best = 0;
  auto key = [&](const Value& v) { return sort_key(attribute ? attribute_of(v, *attribute) : v, case_sensitive); };
  for (size_t i = 1; i < items.size(); ++i) {
    const int c = compare(key(items[i]), key(items[best]));
    if (want_max ? c > 0 : c < 0) best = i;
  }
  return items[best];
}

Value f_max(const Value& in, const CallArgs& args) { return extreme(in, args, true); }
Value f_min(const Value& in, const CallArgs& args) { return extreme(in, args, false); }

// select/reject/selectattr/rejectattr share this: keep items whose test result equals `keep`.
Value select_items(const Value& in, const CallArgs& args, bool keep, bool by_attribute) {
  size_t next = 0;
  const Value* attribute = nullptr;
  if (by_attribute) {
    if (args.positional.empty()) filter_error("selectattr/rejectattr need an attribute name");
    attribute = &args.positional[next++];
  }
  TestFn test = nullptr;
  if (next < args.positional.size()) {
    const std::string name = args.positional[next++].str();
    test = find_test(name);
    if (!test) filter_error("no test named '" + name + "'");
  }
  CallArgs test_args{{args.positional.begin() + static_cast<std::ptrdiff_t>(next), args.positional.end()},
                     args.keywords};
  ValueList out;
  for (const Value& v : iterate(in)) {
    const Value subject = attribute ? attribute_of(v, *attribute) : v;
    const bool passed = test ? test(subject, test_args) : subject.truthy();
    if (passed == keep) out.push_back(v);
  }
  return Value(std::move(out));
}

Value f_select(const Value& in, const CallArgs& args) { return select_items(in, args, true, false); }
Value f_reject(const Value& in, const CallArgs& args) { return select_items(in, args, false, false); }
Value f_selectattr(const Value& in, const CallArgs& args) { return select_items(in, args, true, true); }
Value f_rejectattr(const Value& in, const CallArgs& args) { return select_items(in, args, false, true); }

Value f_replace(const Value& in, const CallArgs& args) {
  const Value* from = args.get(0, "old");
  const Value* to = args.get(1, "new");
  const Value* count = args.get(2, "count");
  if (!from || !to) filter_error("replace filter needs old and new strings");
  return Value(py_replace(in.str(), from->str(), to->str(), count && count->is_int() ? count->as_int() : -1));
}

Value f_reverse(const Value& in, const CallArgs&) {
  if (in.is_string()) return slice(in, Value(), Value(), Value(static_cast<int64_t>(-1)));
  ValueList items = iterate(in);
  std::reverse(items.begin(), items.end());
  return Value(std::move(items));
}

Value f_round(const Value& in, const CallArgs& args) {
  const Value* precision = args.get(0, "precision");
  const Value* method = args.get(1, "method");
  const double scale = std::pow(10.0, precision ? precision->number() : 0.0);
  // Python's round() ("common") rounds halves to even, as nearbyint does in the default rounding mode.
  const double x = in.number() * scale;
  const std::string how = method ? method->str() : "common";
  double r = how == "ceil" ? std::ceil(x) : how == "floor" ? std::floor(x) : std::nearbyint(x);
  return Value(r / scale);
}

Value f_sort(const Value& in, const CallArgs& args) {
  const bool reverse = flag(args, 0, "reverse");
  const bool case_sensitive = flag(args, 1, "case_sensitive");
  const Value* attribute = args.get(2, "attribute");
  ValueList items = iterate(in);
  auto key = [&](const Value& v) { return sort_key(attribute ? attribute_of(v, *attribute) : v, case_sensitive); };
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    return reverse ? compare(key(b), key(a)) < 0 : compare(key(a), key(b)) < 0;
  });
  return Value(std::move(items));
}

Value f_sum(const Value& in, const CallArgs& args) {
  const Value* attribute = args.get(0, "attribute");
  const Value* start = args.get(1, "start");
  Value total = start ? *start : Value(static_cast<int64_t>(0));
  for (const Value& v : iterate(in)) total = binary_op("+", total, attribute ? attribute_of(v, *attribute) : v);
  return total;
}

// json.dumps(sort_keys=True): a copy with every mapping's keys in code point order.
Value with_sorted_keys(const Value& v) {
  if (!v.is_list() && (!v.is_dict() || v.is_namespace())) return v;
  const ValueDepthGuard nest;
  if (v.is_list()) {
    ValueList out;
    for (const Value& item : v.list()) out.push_back(with_sorted_keys(item));
    return Value(std::move(out));
  }
  Value out = Value::dict();
  for (const auto& [k, item] : v.dict_ref().items) out.dict_ref().items.emplace_back(k, with_sorted_keys(item));
  auto& items = out.dict_ref().items;
  std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

Value f_tojson(const Value& in, const CallArgs& args) {
  const Value* indent = args.get(0, "indent");
  const double w = indent && !indent->is_none() ? indent->number() : -1;
  if (!(w <= 1024)) throw Error(ErrorKind::InvalidArgument, "tojson indent must be at most 1024");
  const int width = w < 0 ? -1 : static_cast<int>(w);
  return Value(to_json(flag(args, SIZE_MAX, "sort_keys") ? with_sorted_keys(in) : in, width));
}

Value f_trim(const Value& in, const CallArgs& args) {
  return Value(py_strip(in.str(), args.get(0, "chars"), true, true));
}

Value f_unique(const Value& in, const CallArgs& args) {
  const bool case_sensitive = flag(args, 0, "case_sensitive");
  const Value* attribute = args.get(1, "attribute");
  ValueList out, seen;
  for (const Value& v : iterate(in)) {
    const Value key = sort_key(attribute ? attribute_of(v, *attribute) : v, case_sensitive);
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) continue;
    seen.push_back(key);
    out.push_back(v);
  }
  return Value(std::move(out));
}

Value f_wordcount(const Value& in, const CallArgs&) {
  return Value(static_cast<int64_t>(py_split(in.str(), nullptr, -1).size()));
}

Value f_center(const Value& in, const CallArgs& args) {
  const Value* width = args.get(0, "width");
  const std::string s = in.str();
  const double wd = width ? width->number() : 80;
  RenderBudget::check_string(wd > 0 ? static_cast<size_t>(std::min(wd, 1e18)) : 0, "a centered string");
  const size_t w = wd > 0 ? static_cast<size_t>(wd) : 0;
  const size_t len = utf8_length(s);
  if (len >= w) return Value(s);
  const size_t total = w - len, left = total / 2 + (total & w & 1);
  return Value(std::string(left, ' ') + s + std::string(total - left, ' '));
}

const std::map<std::string, FilterFn>& registry() {
  static const std::map<std::string, FilterFn> filters = {
      {"abs", f_abs},
      {"attr", f_attr},
      {"capitalize", f_capitalize},
      {"center", f_center},
      {"count", f_length},
      {"d", f_default},
      {"default", f_default},
      {"dictsort", f_dictsort},
      {"e", f_escape},
      {"escape", f_escape},
      {"first", f_first},
      {"float", f_float},
      {"indent", f_indent},
      {"int", f_int},
      {"items", f_items},
      {"join", f_join},
      {"last", f_last},
      {"length", f_length},
      {"list", f_list},
      {"lower", f_lower},
      {"map", f_map},
      {"max", f_max},
      {"min", f_min},
      {"reject", f_reject},
      {"rejectattr", f_rejectattr},
      {"replace", f_replace},
      {"reverse", f_reverse},
      {"round", f_round},
      {"safe", f_safe},
      {"select", f_select},
      {"selectattr", f_selectattr},
      {"sort", f_sort},
      {"string", f_string},
      {"sum", f_sum},
      {"title", f_title},
      {"tojson", f_tojson},
      {"trim", f_trim},
      {"unique", f_unique},
      {"upper", f_upper},
      {"wordcount", f_wordcount},
  };
  return filters;
}

}  // namespace

FilterFn find_filter(const std::string& name) {
  const auto& filters = registry();
  const auto it = filters.find(name);
  return it == filters.end() ? nullptr : it->second;
}

}  // namespace lathe::jinja
