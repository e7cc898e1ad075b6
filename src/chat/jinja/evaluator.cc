#include "chat/jinja/evaluator.h"

#include "chat/jinja/budget.h"
#include "chat/jinja/builtins.h"
#include "chat/jinja/ops.h"
#include "chat/jinja/template.h"
#include "common/error.h"
#include "common/limits.h"

namespace lathe::jinja {
namespace {

// An error that already names its template position, so enclosing statements pass it on unchanged.
class PositionedError : public Error {
 public:
  using Error::Error;
};

constexpr int kMaxCallDepth = limits::kJinjaMaxCallDepth;
// Statements and expressions nested across macro calls: keeps the evaluator's recursion far from the end of
// the stack (a parse is limited in depth, but macros multiply it).
constexpr int kMaxEvalDepth = 1024;

// Counts one level of evaluation nesting for the guard's lifetime.
class DepthGuard {
 public:
  explicit DepthGuard(int& depth) : depth_(depth) {
    if (++depth_ > kMaxEvalDepth) {
      --depth_;
      throw Error(ErrorKind::InvalidArgument, "template exceeds its render budget: nested deeper than " +
                                                  std::to_string(kMaxEvalDepth) + " levels");
    }
  }
  ~DepthGuard() { --depth_; }
  DepthGuard(const DepthGuard&) = delete;
  DepthGuard& operator=(const DepthGuard&) = delete;

 private:
  int& depth_;
};

// A computed value within the size limits (its parts were, so it is at most a few times over when it fails).
Value sized(Value v) {
  if (v.is_string()) RenderBudget::check_string(v.as_string().size(), "a string");
  if (v.is_list()) RenderBudget::check_list(v.list().size(), "a list");
  return v;
}

[[noreturn]] void runtime_error(const std::string& message) { throw Error(ErrorKind::InvalidArgument, message); }

void bind_targets(Scope& scope, const std::vector<std::string>& targets, const Value& v) {
  if (targets.size() == 1) {
    scope.vars[targets[0]] = v;
    return;
  }
  const ValueList items = iterate(v);
  if (items.size() != targets.size())
    runtime_error(items.size() < targets.size()
                      ? "not enough values to unpack (expected " + std::to_string(targets.size()) + ", got " +
                            std::to_string(items.size()) + ")"
                      : "too many values to unpack (expected " + std::to_string(targets.size()) + ")");
  for (size_t i = 0; i < targets.size(); ++i) scope.vars[targets[i]] = items[i];
}

}  // namespace

const Value* Scope::lookup(const std::string& name) const {
  for (const Scope* s = this; s; s = s->parent.get()) {
    const auto it = s->vars.find(name);
    if (it != s->vars.end()) return &it->second;
  }
  return nullptr;
}

void Evaluator::render(const Body& body, const ScopePtr& root, std::string& out) { exec_body(body, root, out); }

Evaluator::Flow Evaluator::exec_body(const Body& body, const ScopePtr& scope, std::string& out) {
  for (const StmtPtr& s : body) {
    const Flow f = exec(*s, scope, out);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

Evaluator::Flow Evaluator::exec(const Stmt& s, const ScopePtr& scope, std::string& out) {
  try {
    RenderBudget::step();
    const DepthGuard depth(depth_);
    switch (s.kind) {
      case Stmt::Kind::Text:
        RenderBudget::check_string(out.size() + s.text.size(), "the output");
        out += s.text;
        return Flow::Normal;
      case Stmt::Kind::Output: {
        const Value v = eval(*s.expr, scope);
        // A string is appended from where it is held (str() would copy it first).
        const std::string copied = v.is_string() ? std::string() : v.str();
        const std::string& text = v.is_string() ? v.as_string() : copied;
        RenderBudget::check_string(out.size() + text.size(), "the output");
        out += text;
        return Flow::Normal;
      }
      case Stmt::Kind::If:
        for (const auto& [cond, body] : s.branches)
          if (eval(*cond, scope).truthy()) return exec_body(body, scope, out);
        return exec_body(s.else_body, scope, out);
      case Stmt::Kind::For: return exec_for(s, scope, out);
      case Stmt::Kind::Set: exec_set(s, scope); return Flow::Normal;
      case Stmt::Kind::BlockSet: {
        std::string captured;
        exec_body(s.body, scope, captured);
        scope->vars[s.targets[0]] = Value(std::move(captured));
        return Flow::Normal;
      }
      case Stmt::Kind::Macro: scope->vars[s.name] = make_macro(s, scope); return Flow::Normal;
      case Stmt::Kind::CallBlock: {
        std::weak_ptr<Scope> defining = scope;
        const Value caller = Value::function(
            "caller", [this, &s, defining](const CallArgs& args) { return call_macro(s, defining, args, true); });
        const std::string text = eval_call(*s.expr, scope, &caller).str();
        RenderBudget::check_string(out.size() + text.size(), "the output");
        out += text;
        return Flow::Normal;
      }
      case Stmt::Kind::FilterBlock: {
        std::string captured;
        exec_body(s.body, scope, captured);
        const std::string text = apply_filter(*s.expr, Value(std::move(captured)), scope).str();
        RenderBudget::check_string(out.size() + text.size(), "the output");
        out += text;
        return Flow::Normal;
      }
      case Stmt::Kind::Break: return Flow::Break;
      case Stmt::Kind::Continue: return Flow::Continue;
      case Stmt::Kind::Generation: return exec_body(s.body, scope, out);
    }
  } catch (const TemplateRaised&) {
    throw;
  } catch (const PositionedError&) {
    throw;
  } catch (const Error& e) {
    throw PositionedError(e.kind(), "template error at " + s.pos.str() + ": " + e.what());
  }
  return Flow::Normal;
}

Evaluator::Flow Evaluator::exec_for(const Stmt& s, const ScopePtr& scope, std::string& out) {
  const Value iterable = eval(*s.expr, scope);
  if (iterable.is_none()) runtime_error("'NoneType' object is not iterable");
  ValueList items = iterate(iterable);
  if (s.filter) {
    ValueList kept;
    for (const Value& item : items) {
      auto probe = std::make_shared<Scope>(Scope{scope, {}});
      bind_targets(*probe, s.targets, item);
      if (eval(*s.filter, probe).truthy()) kept.push_back(item);
    }
    items = std::move(kept);
  }
  if (items.empty()) return exec_body(s.else_body, scope, out);
  const int64_t n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    // An iteration (a scope and a loop object) costs as much as a dozen expressions, even with an empty body.
    RenderBudget::step(16);
    auto body_scope = std::make_shared<Scope>(Scope{scope, {}});
    bind_targets(*body_scope, s.targets, items[static_cast<size_t>(i)]);
    Value loop = Value::dict();
    ValueDict& l = loop.dict_ref();
    l.set("index", Value(i + 1));
    l.set("index0", Value(i));
    l.set("revindex", Value(n - i));
    l.set("revindex0", Value(n - i - 1));
    l.set("first", Value(i == 0));
    l.set("last", Value(i == n - 1));
    l.set("length", Value(n));
    l.set("depth", Value(static_cast<int64_t>(1)));
    l.set("depth0", Value(static_cast<int64_t>(0)));
    if (i > 0) l.set("previtem", items[static_cast<size_t>(i - 1)]);
    if (i + 1 < n) l.set("nextitem", items[static_cast<size_t>(i + 1)]);
    l.set("cycle", Value::function("cycle", [i](const CallArgs& args) {
            if (args.positional.empty()) runtime_error("no items for cycling given");
            return args.positional[static_cast<size_t>(i) % args.positional.size()];
          }));
    body_scope->vars["loop"] = std::move(loop);
    if (exec_body(s.body, body_scope, out) == Flow::Break) break;
  }
  return Flow::Normal;
}

void Evaluator::exec_set(const Stmt& s, const ScopePtr& scope) {
  Value v = eval(*s.expr, scope);
  if (!s.attr_target) {
    bind_targets(*scope, s.targets, v);
    return;
  }
  const Value* target = scope->lookup(s.targets[0]);
  if (!target || !target->is_namespace())
    runtime_error("cannot assign attribute '" + s.targets[1] + "' on non-namespace object '" + s.targets[0] + "'");
  // No cycle check here (it would walk the value on every `ns.x = ns.x + [...]`): a namespace put inside itself
  // is as legal as in Python; walks stop at their depth limit and Template::render breaks the cycle at the end.
  target->dict_ref().set(s.targets[1], std::move(v));
}

Value Evaluator::make_macro(const Stmt& s, const ScopePtr& scope) {
  std::weak_ptr<Scope> defining = scope;
  return Value::function(s.name,
                         [this, &s, defining](const CallArgs& args) { return call_macro(s, defining, args, false); });
}

Value Evaluator::call_macro(const Stmt& s, const std::weak_ptr<Scope>& defining, const CallArgs& args, bool is_caller) {
  const std::string what = is_caller ? std::string("caller") : "macro '" + s.name + "'";
  if (args.positional.size() > s.params.size())
    runtime_error(what + " takes not more than " + std::to_string(s.params.size()) + " argument(s)");
  auto scope = std::make_shared<Scope>(Scope{defining.lock(), {}});
  for (const auto& [key, value] : args.keywords) {
    bool known = key == "caller";
    for (const MacroParam& p : s.params) known = known || p.name == key;
    if (!known) runtime_error(what + " takes no keyword argument '" + key + "'");
    if (key == "caller") scope->vars["caller"] = value;
  }
  for (size_t i = 0; i < s.params.size(); ++i) {
    const MacroParam& p = s.params[i];
    if (const Value* given = args.get(i, p.name)) {
      scope->vars[p.name] = *given;
    } else if (p.default_value) {
      scope->vars[p.name] = eval(*p.default_value, scope);
    } else {
      scope->vars[p.name] = Value::undefined("'" + p.name + "' is undefined");
    }
  }
  if (call_depth_ >= kMaxCallDepth) runtime_error("maximum macro recursion depth exceeded in " + what);
  ++call_depth_;
  std::string out;
  try {
    exec_body(s.body, scope, out);
  } catch (...) {
    --call_depth_;
    throw;
  }
  --call_depth_;
  return Value(std::move(out));
}

CallArgs Evaluator::eval_args(const Expr& e, const ScopePtr& scope) {
  CallArgs args;
  for (const ExprPtr& a : e.args) args.positional.push_back(eval(*a, scope));
  for (const auto& [k, v] : e.kwargs) args.keywords.emplace_back(k, eval(*v, scope));
  return args;
}

Value Evaluator::eval_call(const Expr& e, const ScopePtr& scope, const Value* caller) {
  CallArgs args = eval_args(e, scope);
  if (caller) args.keywords.emplace_back("caller", *caller);
  const Expr& callee = *e.a;
  Value fn;
  if (callee.kind == Expr::Kind::GetAttr) {
    const Value obj = eval(*callee.a, scope);
    if (obj.is_undefined()) throw_undefined(obj);
    const Value* member = obj.is_dict() ? obj.dict_ref().find(callee.name) : nullptr;
    if (!member || !member->is_callable()) {
      if (std::optional<Value> result = call_method(obj, callee.name, args)) return *result;
    }
    fn = member ? *member : get_attr(obj, callee.name);
  } else {
    fn = eval(callee, scope);
  }
  if (fn.is_undefined()) throw_undefined(fn);
  if (!fn.is_callable()) runtime_error("'" + fn.type_name() + "' object is not callable");
  return fn.callable().fn(args);
}

Value Evaluator::apply_filter(const Expr& f, Value input, const ScopePtr& scope) {
  if (f.a) input = apply_filter(*f.a, std::move(input), scope);
  const FilterFn fn = find_filter(f.name);
  if (!fn) runtime_error("no filter named '" + f.name + "'");
  return fn(input, eval_args(f, scope));
}

Value Evaluator::eval_binary(const Expr& e, const ScopePtr& scope) {
  const std::string& op = e.name;
  if (op == "and") {
    Value a = eval(*e.a, scope);
    return a.truthy() ? eval(*e.b, scope) : a;
  }
  if (op == "or") {
    Value a = eval(*e.a, scope);
    return a.truthy() ? a : eval(*e.b, scope);
  }
  Value a = eval(*e.a, scope);
  const Value b = eval(*e.b, scope);
  if (op == "+" || op == "~") {
    // A left side that nothing else holds (the running result of `x + y + z`) grows in place: a chain of
    // concatenations around a large message costs its bytes once, not once per `+`.
    if (std::string* s = a.unshared_string(); s && (b.is_string() || op == "~")) {
      if (b.is_string())
        s->append(b.as_string());
      else
        s->append(b.str());
      return a;
    }
  }
  if (op == "==") return Value(a == b);
  if (op == "!=") return Value(!(a == b));
  if (op == "in") return Value(contains(b, a));
  if (op == "not in") return Value(!contains(b, a));
  return binary_op(op, a, b);
}

Value Evaluator::eval(const Expr& e, const ScopePtr& scope) {
  RenderBudget::step();
  const DepthGuard depth(depth_);
  switch (e.kind) {
    case Expr::Kind::Literal: return e.value;
    case Expr::Kind::Name: {
      const Value* v = scope->lookup(e.name);
      return v ? *v : Value::undefined("'" + e.name + "' is undefined");
    }
    case Expr::Kind::List: {
      ValueList items;
      for (const ExprPtr& a : e.args) items.push_back(eval(*a, scope));
      return Value(std::move(items));
    }
    case Expr::Kind::Dict: {
      Value d = Value::dict();
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        const Value key = eval(*e.args[i], scope);
        d.dict_ref().set(key.is_string() ? key.as_string() : key.str(), eval(*e.args[i + 1], scope));
      }
      return d;
    }
    case Expr::Kind::GetAttr: return get_attr(eval(*e.a, scope), e.name);
    case Expr::Kind::GetItem: return get_item(eval(*e.a, scope), eval(*e.b, scope));
    case Expr::Kind::Slice: {
      Value bounds[3];
      for (size_t i = 0; i < 3; ++i)
        if (e.args[i]) bounds[i] = eval(*e.args[i], scope);
      return slice(eval(*e.a, scope), bounds[0], bounds[1], bounds[2]);
    }
    case Expr::Kind::Call: return sized(eval_call(e, scope, nullptr));
    case Expr::Kind::Filter: {
      const FilterFn fn = find_filter(e.name);
      if (!fn) runtime_error("no filter named '" + e.name + "'");
      const Value input = eval(*e.a, scope);
      return sized(fn(input, eval_args(e, scope)));
    }
    case Expr::Kind::Test: {
      const TestFn fn = find_test(e.name);
      if (!fn) runtime_error("no test named '" + e.name + "'");
      const Value subject = eval(*e.a, scope);
      return Value(fn(subject, eval_args(e, scope)) != e.negated);
    }
    case Expr::Kind::Unary: {
      const Value v = eval(*e.a, scope);
      if (e.name == "not") return Value(!v.truthy());
      if (v.is_undefined()) throw_undefined(v);
      if (!v.is_number()) runtime_error("bad operand type for unary " + e.name + ": '" + v.type_name() + "'");
      if (e.name == "+") return v.is_bool() ? Value(static_cast<int64_t>(v.as_bool())) : v;
      if (v.is_float()) return Value(-v.as_float());
      if (v.is_int() && v.as_int() == INT64_MIN) runtime_error("integer overflow in unary -");
      return Value(-(v.is_bool() ? static_cast<int64_t>(v.as_bool()) : v.as_int()));
    }
    case Expr::Kind::Binary: return sized(eval_binary(e, scope));
    case Expr::Kind::Cond:
      if (eval(*e.b, scope).truthy()) return eval(*e.a, scope);
      return e.c ? eval(*e.c, scope) : Value::undefined("conditional expression evaluated to no value");
  }
  return Value::undefined();
}

}  // namespace lathe::jinja
