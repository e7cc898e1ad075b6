// Executes a statement tree: Jinja scoping (for-loop bodies and macros get their own scope, if-blocks do not),
// loop variables, macros with defaults and caller(), and error positions.
#pragma once
#include <memory>
#include <string>
#include <unordered_map>

#include "chat/jinja/ast.h"
#include "chat/jinja/value.h"

namespace lathe::jinja {

struct Scope {
  std::shared_ptr<Scope> parent;
  std::unordered_map<std::string, Value> vars;

  const Value* lookup(const std::string& name) const;
};
using ScopePtr = std::shared_ptr<Scope>;

class Evaluator {
 public:
  void render(const Body& body, const ScopePtr& root, std::string& out);

 private:
  enum class Flow { Normal, Break, Continue };

  Flow exec_body(const Body& body, const ScopePtr& scope, std::string& out);
  Flow exec(const Stmt& s, const ScopePtr& scope, std::string& out);
  Flow exec_for(const Stmt& s, const ScopePtr& scope, std::string& out);
  void exec_set(const Stmt& s, const ScopePtr& scope);
  Value eval(const Expr& e, const ScopePtr& scope);
  Value eval_call(const Expr& e, const ScopePtr& scope, const Value* caller);
  Value eval_binary(const Expr& e, const ScopePtr& scope);
  Value apply_filter(const Expr& f, Value input, const ScopePtr& scope);
  CallArgs eval_args(const Expr& e, const ScopePtr& scope);
  Value make_macro(const Stmt& s, const ScopePtr& scope);
  Value call_macro(const Stmt& s, const std::weak_ptr<Scope>& defining, const CallArgs& args, bool is_caller);

  int call_depth_ = 0;
  int depth_ = 0;  // statements and expressions being evaluated, nested
};

}  // namespace lathe::jinja
