// Jinja2's built-in tests (`x is defined`, `x is string`, `x is equalto y`, ...).
#include <map>

#include "chat/jinja/builtins.h"
#include "chat/jinja/ops.h"
#include "common/error.h"

namespace lathe::jinja {
namespace {

const Value& operand(const CallArgs& args, const char* test) {
  const Value* v = args.get(0, "other");
  if (!v) throw Error(ErrorKind::InvalidArgument, std::string("test '") + test + "' needs an argument");
  return *v;
}

bool t_defined(const Value& v, const CallArgs&) { return !v.is_undefined(); }
bool t_undefined(const Value& v, const CallArgs&) { return v.is_undefined(); }
bool t_none(const Value& v, const CallArgs&) { return v.is_none(); }
bool t_boolean(const Value& v, const CallArgs&) { return v.is_bool(); }
bool t_true(const Value& v, const CallArgs&) { return v.is_bool() && v.as_bool(); }
bool t_false(const Value& v, const CallArgs&) { return v.is_bool() && !v.as_bool(); }
bool t_integer(const Value& v, const CallArgs&) { return v.is_int(); }
bool t_float(const Value& v, const CallArgs&) { return v.is_float(); }
// Python's numbers.Number includes bool.
bool t_number(const Value& v, const CallArgs&) { return v.is_number(); }
bool t_string(const Value& v, const CallArgs&) { return v.is_string(); }
bool t_mapping(const Value& v, const CallArgs&) { return v.is_dict() && !v.is_namespace(); }
// Undefined is iterable (empty) in Jinja; namespaces are not.
bool t_iterable(const Value& v, const CallArgs&) {
  return v.is_undefined() || v.is_string() || v.is_list() || (v.is_dict() && !v.is_namespace());
}
// Anything with len() and [] (strings and dicts included), as Jinja's test_sequence checks.
bool t_sequence(const Value& v, const CallArgs&) { return v.is_string() || v.is_list() || t_mapping(v, {}); }
bool t_callable(const Value& v, const CallArgs&) { return v.is_callable(); }
bool t_lower(const Value& v, const CallArgs&) { return v.is_string() && py_lower(v.as_string()) == v.as_string(); }
bool t_upper(const Value& v, const CallArgs&) { return v.is_string() && py_upper(v.as_string()) == v.as_string(); }
bool t_odd(const Value& v, const CallArgs&) { return v.is_int() && v.as_int() % 2 != 0; }
bool t_even(const Value& v, const CallArgs&) { return v.is_int() && v.as_int() % 2 == 0; }
bool t_divisibleby(const Value& v, const CallArgs& args) {
  const Value& n = operand(args, "divisibleby");
  if (v.is_int() && n.is_int()) return n.as_int() != 0 && v.as_int() % n.as_int() == 0;
  return false;
}
bool t_eq(const Value& v, const CallArgs& args) { return v == operand(args, "=="); }
bool t_ne(const Value& v, const CallArgs& args) { return !(v == operand(args, "!=")); }
bool t_lt(const Value& v, const CallArgs& args) { return compare(v, operand(args, "<")) < 0; }
bool t_le(const Value& v, const CallArgs& args) { return compare(v, operand(args, "<=")) <= 0; }
bool t_gt(const Value& v, const CallArgs& args) { return compare(v, operand(args, ">")) > 0; }
bool t_ge(const Value& v, const CallArgs& args) { return compare(v, operand(args, ">=")) >= 0; }
bool t_in(const Value& v, const CallArgs& args) { return contains(operand(args, "in"), v); }
// `sameas` is identity: same shared container, or equal scalars of the same type.
bool t_sameas(const Value& v, const CallArgs& args) {
  const Value& other = operand(args, "sameas");
  if (v.type() != other.type()) return false;
  if (v.is_list()) return &v.list() == &other.list();
  if (v.is_dict()) return v.dict_ptr() == other.dict_ptr();
  return v == other;
}
bool t_escaped(const Value&, const CallArgs&) { return false; }
bool t_filter(const Value& v, const CallArgs&) { return v.is_string() && find_filter(v.as_string()) != nullptr; }
bool t_test(const Value& v, const CallArgs&) { return v.is_string() && find_test(v.as_string()) != nullptr; }

const std::map<std::string, TestFn>& jinja_test_registry() {
  static const std::map<std::string, TestFn> tests = {
      {"defined", t_defined},
      {"undefined", t_undefined},
      {"none", t_none},
      {"boolean", t_boolean},
      {"true", t_true},
      {"false", t_false},
      {"integer", t_integer},
      {"float", t_float},
      {"number", t_number},
      {"string", t_string},
      {"mapping", t_mapping},
      {"iterable", t_iterable},
      {"sequence", t_sequence},
      {"callable", t_callable},
      {"lower", t_lower},
      {"upper", t_upper},
      {"odd", t_odd},
      {"even", t_even},
      {"divisibleby", t_divisibleby},
      {"eq", t_eq},
      {"equalto", t_eq},
      {"==", t_eq},
      {"ne", t_ne},
      {"!=", t_ne},
      {"lt", t_lt},
      {"lessthan", t_lt},
      {"<", t_lt},
      {"le", t_le},
      {"<=", t_le},
      {"gt", t_gt},
      {"greaterthan", t_gt},
      {">", t_gt},
      {"ge", t_ge},
      {">=", t_ge},
      {"in", t_in},
      {"sameas", t_sameas},
      {"escaped", t_escaped},
      {"filter", t_filter},
      {"test", t_test},
  };
  return tests;
}

}  // namespace

TestFn find_test(const std::string& name) {
  const auto& tests = jinja_test_registry();
  const auto it = tests.find(name);
  return it == tests.end() ? nullptr : it->second;
}

}  // namespace lathe::jinja
