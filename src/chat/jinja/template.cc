#include "chat/jinja/template.h"

#include "chat/jinja/builtins.h"
#include "chat/jinja/evaluator.h"
#include "chat/jinja/lexer.h"
#include "chat/jinja/parser.h"
#include "common/limits.h"

namespace lathe::jinja {
namespace {

[[noreturn]] void unknown_name(const Expr& e, const char* what) {
  throw Error(ErrorKind::InvalidArgument,
              "template syntax error at " + e.pos.str() + ": no " + what + " named '" + e.name + "'");
}

// Jinja rejects unknown filters and tests when it compiles a template; so do we, before any rendering.
void check_expr(const Expr* e) {
  if (!e) return;
  if (e->kind == Expr::Kind::Filter && !find_filter(e->name)) unknown_name(*e, "filter");
  if (e->kind == Expr::Kind::Test && !find_test(e->name)) unknown_name(*e, "test");
  check_expr(e->a.get());
  check_expr(e->b.get());
  check_expr(e->c.get());
  for (const ExprPtr& a : e->args) check_expr(a.get());
  for (const auto& kv : e->kwargs) check_expr(kv.second.get());
}

void check_body(const Body& body) {
  for (const StmtPtr& s : body) {
    check_expr(s->expr.get());
    check_expr(s->filter.get());
    for (const auto& [cond, branch] : s->branches) {
      check_expr(cond.get());
      check_body(branch);
    }
    for (const MacroParam& p : s->params) check_expr(p.default_value.get());
    check_body(s->body);
    check_body(s->else_body);
  }
}

int64_t int_arg(const Value& v) {
  if (!v.is_int() && !v.is_bool())
    throw Error(ErrorKind::InvalidArgument, "'" + v.type_name() + "' object cannot be interpreted as an integer");
  return v.is_bool() ? static_cast<int64_t>(v.as_bool()) : v.as_int();
}

Value builtin_range(const CallArgs& args) {
  const auto& p = args.positional;
  if (p.empty() || p.size() > 3) throw Error(ErrorKind::InvalidArgument, "range expected 1 to 3 arguments");
  const int64_t start = p.size() == 1 ? 0 : int_arg(p[0]);
  const int64_t stop = p.size() == 1 ? int_arg(p[0]) : int_arg(p[1]);
  const int64_t step = p.size() == 3 ? int_arg(p[2]) : 1;
  if (step == 0) throw Error(ErrorKind::InvalidArgument, "range() arg 3 must not be zero");
  constexpr int64_t kMaxRange = 1 << 20;  // the sandbox's MAX_RANGE
  ValueList out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (static_cast<int64_t>(out.size()) >= kMaxRange)
      throw Error(ErrorKind::InvalidArgument, "range too big (the sandbox allows at most 1048576 items)");
    RenderBudget::step();  // building the list costs like iterating it
    out.emplace_back(i);
  }
  return Value(std::move(out));
}

Value builtin_mapping(const CallArgs& args, bool is_namespace) {
  Value d = Value::dict();
  d.dict_ref().is_namespace = is_namespace;
  for (const Value& p : args.positional)
    if (p.is_dict())
      for (const auto& [k, v] : p.dict_ref().items) d.dict_ref().set(k, v);
  for (const auto& [k, v] : args.keywords) d.dict_ref().set(k, v);
  return d;
}

}  // namespace

Template::Template(const std::string& source, const TemplateOptions& options) {
  if (source.size() > limits::kJinjaMaxSourceBytes)
    throw Error(ErrorKind::InvalidArgument, "template is " + std::to_string(source.size()) + " bytes; the limit is " +
                                                std::to_string(limits::kJinjaMaxSourceBytes));
  body_ = parse(tokenize(source, LexOptions{options.trim_blocks, options.lstrip_blocks}));
  check_body(body_);
}

namespace {

// The namespaces one render created. Any still alive once the render's scopes are gone can only be held by a
// cycle through itself (`{% set ns.me = [ns] %}`): emptying it frees the cycle instead of leaking it.
struct NamespaceSweep {
  std::vector<std::weak_ptr<ValueDict>> created;
  NamespaceSweep() = default;
  NamespaceSweep(const NamespaceSweep&) = delete;
  NamespaceSweep& operator=(const NamespaceSweep&) = delete;
  ~NamespaceSweep() {
    for (const std::weak_ptr<ValueDict>& w : created)
      if (std::shared_ptr<ValueDict> ns = w.lock()) {
        std::vector<std::pair<std::string, Value>> items;
        items.swap(ns->items);  // released after `ns` is no longer in use
      }
  }
};

}  // namespace

std::string Template::render(const ValueDict& variables, const RenderLimits& limits) const {
  const RenderBudget budget(limits);
  NamespaceSweep sweep;  // declared before the scopes, so it runs after they are destroyed
  auto globals = std::make_shared<Scope>();
  globals->vars["range"] = Value::function("range", builtin_range);
  globals->vars["namespace"] = Value::function("namespace", [&sweep](const CallArgs& args) {
    Value ns = builtin_mapping(args, true);
    sweep.created.push_back(ns.dict_ptr());
    return ns;
  });
  globals->vars["dict"] = Value::function("dict", [](const CallArgs& args) { return builtin_mapping(args, false); });
  auto root = std::make_shared<Scope>(Scope{globals, {}});
  for (const auto& [k, v] : variables.items) root->vars[k] = v;
  std::string out;
  Evaluator().render(body_, root, out);
  return out;
}

}  // namespace lathe::jinja
