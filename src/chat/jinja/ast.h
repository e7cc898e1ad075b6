// The parsed form of a template: expression and statement nodes with the source position each came from.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/jinja/lexer.h"
#include "chat/jinja/value.h"

namespace lathe::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    Literal,  // value
    Name,     // name
    List,     // args (list and tuple literals)
    Dict,     // args: key0, value0, key1, value1, ...
    GetAttr,  // a.name
    GetItem,  // a[b]
    Slice,    // a[args[0]:args[1]:args[2]], absent bounds are null
    Call,     // a(args, kwargs)
    Filter,   // a | name(args, kwargs); a is null inside {% filter %}
    Test,     // a is [not] name(args, kwargs)
    Unary,    // op a: "not", "-", "+"
    Binary,   // a op b
    Cond,     // a if b else c (c may be null)
  };
  Kind kind;
  SourcePos pos;
  Value value;
  std::string name;  // variable, attribute, filter or test name, or operator
  bool negated = false;
  ExprPtr a, b, c;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null when the parameter has no default
};

struct Stmt {
  enum class Kind {
    Text,         // text
    Output,       // {{ expr }}
    If,           // branches (condition, body); else_body
    For,          // targets in expr [if filter] body [else else_body]
    Set,          // targets = expr, or attr_target.attr = expr
    BlockSet,     // {% set target %}body{% endset %}
    Macro,        // name(params) body
    CallBlock,    // {% call(params) expr %}body{% endcall %}
    FilterBlock,  // {% filter expr %}body{% endfilter %}
    Break,
    Continue,
    Generation,  // {% generation %}body{% endgeneration %} (transformers' assistant-mask marker)
  };
  Kind kind;
  SourcePos pos;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;                    // For: the `if` condition
  std::vector<std::string> targets;  // For/Set: names bound; Set with attr: {namespace, attribute}
  bool attr_target = false;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
  std::string name;  // Macro
  std::vector<MacroParam> params;
};

}  // namespace lathe::jinja
