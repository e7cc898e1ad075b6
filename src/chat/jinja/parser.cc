#include "chat/jinja/parser.h"

#include <charconv>
#include <cstdlib>
#include <initializer_list>

#include "common/error.h"
#include "common/limits.h"

namespace lathe::jinja {
namespace {

using TK = Token::Kind;

std::string describe(const Token& t) {
  switch (t.kind) {
    case TK::Text: return "text";
    case TK::VarBegin: return "'{{'";
    case TK::VarEnd: return "'}}'";
    case TK::BlockBegin: return "'{%'";
    case TK::BlockEnd: return "'%}'";
    case TK::Eof: return "end of template";
    case TK::String: return "string literal";
    default: return "'" + t.text + "'";
  }
}

StmtPtr new_stmt(Stmt::Kind kind, const SourcePos& pos) {
  auto s = std::make_unique<Stmt>();
  s->kind = kind;
  s->pos = pos;
  return s;
}

class Parser {
  // One level of nesting (a block, a sub-expression) for the guard's lifetime: the parser recurses, so
  // 100k nested parentheses must be an error, not the end of the stack.
  class Nest {
   public:
    explicit Nest(Parser& p) : p_(p) {
      if (++p_.depth_ > limits::kJinjaMaxParseDepth)
        p_.fail(p_.peek(), "nested deeper than " + std::to_string(limits::kJinjaMaxParseDepth) + " levels");
    }
    ~Nest() { --p_.depth_; }
    Nest(const Nest&) = delete;
    Nest& operator=(const Nest&) = delete;

   private:
    Parser& p_;
  };

 public:
  explicit Parser(const std::vector<Token>& tokens) : toks_(tokens) {}

  Body parse_template() {
    Body body = parse_body({}, nullptr);
    if (peek().kind != TK::Eof) fail(peek(), "unexpected " + describe(peek()));
    return body;
  }

 private:
  const Token& peek(size_t ahead = 0) const {
    const size_t i = idx_ + ahead;
    return i < toks_.size() ? toks_[i] : toks_.back();
  }
  const Token& next() { return toks_[idx_ < toks_.size() - 1 ? idx_++ : idx_]; }
  bool is_op(const char* op, size_t ahead = 0) const { return peek(ahead).kind == TK::Op && peek(ahead).text == op; }
  bool is_name(const char* name, size_t ahead = 0) const {
    return peek(ahead).kind == TK::Name && peek(ahead).text == name;
  }
  [[noreturn]] void fail(const Token& at, const std::string& what) const {
    throw Error(ErrorKind::InvalidArgument, "template syntax error at " + at.pos.str() + ": " + what);
  }
  void expect_op(const char* op, const char* context) {
    if (!is_op(op)) fail(peek(), std::string("expected '") + op + "' in " + context + ", found " + describe(peek()));
    next();
  }
  std::string expect_name(const char* context) {
    if (peek().kind != TK::Name)
      fail(peek(), std::string("expected a name in ") + context + ", found " + describe(peek()));
    return next().text;
  }
  void expect_block_end(const char* tag) {
    if (peek().kind != TK::BlockEnd)
      fail(peek(), std::string("expected '%}' to end '") + tag + "' tag, found " + describe(peek()));
    next();
  }

  // Statements until a block tag whose name is in `stops` (left unconsumed) or end of input.
  Body parse_body(std::initializer_list<const char*> stops, const Token* opener) {
    const Nest nest(*this);
    Body body;
    while (true) {
      const Token& t = peek();
      if (t.kind == TK::Eof) {
        if (opener) fail(*opener, "'" + opener->text + "' tag is never closed (reached end of template)");
        return body;
      }
      if (t.kind == TK::Text) {
        auto s = new_stmt(Stmt::Kind::Text, t.pos);
        s->text = t.text;
        body.push_back(std::move(s));
        next();
      } else if (t.kind == TK::VarBegin) {
        next();
        auto s = new_stmt(Stmt::Kind::Output, t.pos);
        s->expr = parse_expression();
        if (peek().kind != TK::VarEnd) fail(peek(), "expected '}}' to end expression, found " + describe(peek()));
        next();
        body.push_back(std::move(s));
      } else if (t.kind == TK::BlockBegin) {
        const Token& tag = peek(1);
        if (tag.kind != TK::Name) fail(tag, "expected a tag name after '{%', found " + describe(tag));
        for (const char* stop : stops)
          if (tag.text == stop) return body;
        body.push_back(parse_statement());
      } else {
        fail(t, "unexpected " + describe(t));
      }
    }
  }

  // Consumes "{% name" for a closing/continuation tag the caller knows is next.
  const Token& take_tag() {
    next();  // {%
    return next();
  }

  StmtPtr parse_statement() {
    next();  // {%
    const Token& tag = next();
    const std::string& name = tag.text;
    if (name == "if") return parse_if(tag);
    if (name == "for") return parse_for(tag);
    if (name == "set") return parse_set(tag);
    if (name == "macro") return parse_macro(tag);
    if (name == "call") return parse_call_block(tag);
    if (name == "filter") return parse_filter_block(tag);
    if (name == "generation") {
      auto s = new_stmt(Stmt::Kind::Generation, tag.pos);
      expect_block_end("generation");
      s->body = parse_body({"endgeneration"}, &tag);
      take_tag();
      expect_block_end("endgeneration");
      return s;
    }
    if (name == "break" || name == "continue") {
      auto s = new_stmt(name == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue, tag.pos);
      expect_block_end(name.c_str());
      return s;
    }
    fail(tag, "unknown or misplaced tag '" + name + "'");
  }

  StmtPtr parse_if(const Token& tag) {
    auto s = new_stmt(Stmt::Kind::If, tag.pos);
    ExprPtr cond = parse_expression();
    expect_block_end("if");
    while (true) {
      Body body = parse_body({"elif", "else", "endif"}, &tag);
      s->branches.emplace_back(std::move(cond), std::move(body));
      const Token& t = take_tag();
      if (t.text == "elif") {
        cond = parse_expression();
        expect_block_end("elif");
        continue;
      }
      if (t.text == "else") {
        expect_block_end("else");
        s->else_body = parse_body({"endif"}, &tag);
        take_tag();
      }
      expect_block_end("endif");
      return s;
    }
  }

  StmtPtr parse_for(const Token& tag) {
    auto s = new_stmt(Stmt::Kind::For, tag.pos);
    const bool paren = is_op("(");
    if (paren) next();
    s->targets.push_back(expect_name("'for' target"));
    while (is_op(",")) {
      next();
      s->targets.push_back(expect_name("'for' target"));
    }
    if (paren) expect_op(")", "'for' target");
    if (!is_name("in")) fail(peek(), "expected 'in' in 'for' tag, found " + describe(peek()));
    next();
    s->expr = parse_or();  // no ternary here: a trailing `if` filters the loop
    if (is_name("if")) {
      next();
      s->filter = parse_expression();
    }
    if (is_name("recursive")) fail(peek(), "recursive 'for' loops are not supported");
    expect_block_end("for");
    s->body = parse_body({"else", "endfor"}, &tag);
    if (take_tag().text == "else") {
      expect_block_end("else");
      s->else_body = parse_body({"endfor"}, &tag);
      take_tag();
    }
    expect_block_end("endfor");
    return s;
  }

  StmtPtr parse_set(const Token& tag) {
    auto s = new_stmt(Stmt::Kind::Set, tag.pos);
    s->targets.push_back(expect_name("'set' target"));
    if (is_op(".")) {
      next();
      s->targets.push_back(expect_name("'set' attribute"));
      s->attr_target = true;
    } else {
      while (is_op(",")) {
        next();
        s->targets.push_back(expect_name("'set' target"));
      }
    }
    if (is_op("=")) {
      next();
      s->expr = parse_tuple_or_expression();
      expect_block_end("set");
      return s;
    }
    if (s->attr_target || s->targets.size() != 1) fail(peek(), "expected '=' in 'set' tag, found " + describe(peek()));
    s->kind = Stmt::Kind::BlockSet;
    expect_block_end("set");
    s->body = parse_body({"endset"}, &tag);
    take_tag();
    expect_block_end("endset");
    return s;
  }

  void parse_params(std::vector<MacroParam>& params, const char* context) {
    expect_op("(", context);
    while (!is_op(")")) {
      MacroParam p;
      p.name = expect_name(context);
      if (is_op("=")) {
        next();
        p.default_value = parse_expression();
      }
      params.push_back(std::move(p));
      if (!is_op(",")) break;
      next();
    }
    expect_op(")", context);
  }

  StmtPtr parse_macro(const Token& tag) {
    auto s = new_stmt(Stmt::Kind::Macro, tag.pos);
    s->name = expect_name("'macro' tag");
    parse_params(s->params, "'macro' parameters");
    expect_block_end("macro");
    s->body = parse_body({"endmacro"}, &tag);
    take_tag();
    if (peek().kind == TK::Name) next();  // {% endmacro name %}
    expect_block_end("endmacro");
    return s;
  }

  StmtPtr parse_call_block(const Token& tag) {
    auto s = new_stmt(Stmt::Kind::CallBlock, tag.pos);
    if (is_op("(")) parse_params(s->params, "'call' parameters");
    s->expr = parse_expression();
    if (s->expr->kind != Expr::Kind::Call) fail(tag, "'call' tag needs a macro call");
    expect_block_end("call");
    s->body = parse_body({"endcall"}, &tag);
    take_tag();
    expect_block_end("endcall");
    return s;
  }

  StmtPtr parse_filter_block(const Token& tag) {
    auto s = new_stmt(Stmt::Kind::FilterBlock, tag.pos);
    ExprPtr chain;
    do {
      if (chain) next();  // '|'
      chain = parse_filter(std::move(chain));
    } while (is_op("|"));
    s->expr = std::move(chain);
    expect_block_end("filter");
    s->body = parse_body({"endfilter"}, &tag);
    take_tag();
    expect_block_end("endfilter");
    return s;
  }

  // ---- expressions, lowest precedence first ----

  ExprPtr make(Expr::Kind kind, const SourcePos& pos) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->pos = pos;
    return e;
  }

  ExprPtr parse_tuple_or_expression() {
    ExprPtr first = parse_expression();
    if (!is_op(",")) return first;
    auto list = make(Expr::Kind::List, first->pos);
    list->args.push_back(std::move(first));
    while (is_op(",")) {
      next();
      if (is_op(")") || peek().kind == TK::BlockEnd || peek().kind == TK::VarEnd) break;  // trailing comma
      list->args.push_back(parse_expression());
    }
    return list;
  }

  ExprPtr parse_expression() {
    const Nest nest(*this);
    ExprPtr e = parse_or();
    while (is_name("if")) {
      const Token& t = next();
      auto cond = make(Expr::Kind::Cond, t.pos);
      cond->a = std::move(e);
      cond->b = parse_or();
      if (is_name("else")) {
        next();
        cond->c = parse_expression();
      }
      e = std::move(cond);
    }
    return e;
  }

  ExprPtr binary(const Token& op, ExprPtr a, ExprPtr b) {
    auto e = make(Expr::Kind::Binary, op.pos);
    e->name = op.text;
    e->a = std::move(a);
    e->b = std::move(b);
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      const Token& t = next();
      e = binary(t, std::move(e), parse_and());
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      const Token& t = next();
      e = binary(t, std::move(e), parse_not());
    }
    return e;
  }

  ExprPtr parse_not() {
    const Nest nest(*this);
    if (is_name("not")) {
      const Token& t = next();
      auto e = make(Expr::Kind::Unary, t.pos);
      e->name = "not";
      e->a = parse_not();
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    ExprPtr e = parse_math1();
    while (true) {
      const Token& t = peek();
      if (t.kind == TK::Op &&
          (t.text == "==" || t.text == "!=" || t.text == "<" || t.text == ">" || t.text == "<=" || t.text == ">=")) {
        next();
        e = binary(t, std::move(e), parse_math1());
      } else if (is_name("in")) {
        next();
        e = binary(t, std::move(e), parse_math1());
      } else if (is_name("not") && is_name("in", 1)) {
        next();
        next();
        Token op = t;
        op.text = "not in";
        e = binary(op, std::move(e), parse_math1());
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = next();
      e = binary(t, std::move(e), parse_concat());
    }
    return e;
  }

  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      const Token& t = next();
      e = binary(t, std::move(e), parse_math2());
    }
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = next();
      e = binary(t, std::move(e), parse_pow());
    }
    return e;
  }

  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      const Token& t = next();
      e = binary(t, std::move(e), parse_unary(true));
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    const Nest nest(*this);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Token& t = next();
      e = make(Expr::Kind::Unary, t.pos);
      e->name = t.text;
      e->a = parse_unary(false);
    } else {
      e = parse_postfix(parse_primary());
    }
    return with_filter ? parse_filter_expr(std::move(e)) : std::move(e);
  }

  ExprPtr parse_primary() {
    const Token& t = peek();
    switch (t.kind) {
      case TK::Name: {
        next();
        if (t.text == "true" || t.text == "True") return literal(t, Value(true));
        if (t.text == "false" || t.text == "False") return literal(t, Value(false));
        if (t.text == "none" || t.text == "None") return literal(t, Value::none());
        auto e = make(Expr::Kind::Name, t.pos);
        e->name = t.text;
        return e;
      }
      case TK::String: {
        std::string s = next().text;
        while (peek().kind == TK::String) s += next().text;  // adjacent literals concatenate
        return literal(t, Value(std::move(s)));
      }
      case TK::Int: {
        next();
        try {
          return literal(t, Value(static_cast<int64_t>(std::stoll(t.text))));
        } catch (const std::exception&) {
          fail(t, "integer literal '" + t.text + "' out of range");
        }
      }
      case TK::Float:
        next();
        // strtod, not stod: a literal beyond double's range is inf (or 0), as in Python, not an exception.
        return literal(t, Value(std::strtod(t.text.c_str(), nullptr)));
      case TK::Op:
        if (t.text == "(") {
          next();
          if (is_op(")")) {
            next();
            return make(Expr::Kind::List, t.pos);
          }
          ExprPtr e = parse_tuple_or_expression();
          expect_op(")", "parenthesised expression");
          return e;
        }
        if (t.text == "[") {
          next();
          auto e = make(Expr::Kind::List, t.pos);
          while (!is_op("]")) {
            e->args.push_back(parse_expression());
            if (!is_op(",")) break;
            next();
          }
          expect_op("]", "list literal");
          return e;
        }
        if (t.text == "{") {
          next();
          auto e = make(Expr::Kind::Dict, t.pos);
          while (!is_op("}")) {
            e->args.push_back(parse_expression());
            expect_op(":", "dict literal");
            e->args.push_back(parse_expression());
            if (!is_op(",")) break;
            next();
          }
          expect_op("}", "dict literal");
          return e;
        }
        break;
      default: break;
    }
    fail(t, "expected an expression, found " + describe(t));
  }

  ExprPtr literal(const Token& t, Value v) {
    auto e = make(Expr::Kind::Literal, t.pos);
    e->value = std::move(v);
    return e;
  }

  void parse_call_args(Expr& e, const char* context) {
    expect_op("(", context);
    while (!is_op(")")) {
      if (peek().kind == TK::Name && is_op("=", 1)) {
        std::string key = next().text;
        next();
        e.kwargs.emplace_back(std::move(key), parse_expression());
      } else {
        e.args.push_back(parse_expression());
      }
      if (!is_op(",")) break;
      next();
    }
    expect_op(")", context);
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      const Token& t = peek();
      if (is_op(".")) {
        next();
        if (peek().kind == TK::Int) {
          auto item = make(Expr::Kind::GetItem, t.pos);
          item->a = std::move(e);
          const Token& index = next();
          int64_t n = 0;
          const auto [end, ec] = std::from_chars(index.text.data(), index.text.data() + index.text.size(), n);
          if (ec != std::errc() || end != index.text.data() + index.text.size())
            fail(index, "integer literal '" + index.text + "' out of range");
          item->b = literal(index, Value(n));
          e = std::move(item);
          continue;
        }
        auto attr = make(Expr::Kind::GetAttr, t.pos);
        attr->a = std::move(e);
        attr->name = expect_name("attribute access");
        e = std::move(attr);
      } else if (is_op("[")) {
        next();
        e = parse_subscript(std::move(e), t);
      } else if (is_op("(")) {
        auto call = make(Expr::Kind::Call, t.pos);
        call->a = std::move(e);
        parse_call_args(*call, "call arguments");
        e = std::move(call);
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr target, const Token& open) {
    ExprPtr parts[3];
    int part = 0;
    bool is_slice = false;
    while (true) {
      if (!is_op(":") && !is_op("]")) parts[part] = parse_expression();
      if (is_op(":") && part < 2) {
        next();
        is_slice = true;
        ++part;
        continue;
      }
      break;
    }
    expect_op("]", "subscript");
    if (!is_slice) {
      if (!parts[0]) fail(open, "empty subscript");
      auto e = make(Expr::Kind::GetItem, open.pos);
      e->a = std::move(target);
      e->b = std::move(parts[0]);
      return e;
    }
    auto e = make(Expr::Kind::Slice, open.pos);
    e->a = std::move(target);
    for (auto& p : parts) e->args.push_back(std::move(p));
    return e;
  }

  ExprPtr parse_filter(ExprPtr input) {
    const Token& t = peek();
    auto f = make(Expr::Kind::Filter, t.pos);
    f->name = expect_name("filter");
    if (is_op("(")) parse_call_args(*f, "filter arguments");
    f->a = std::move(input);
    return f;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        next();
        e = parse_filter(std::move(e));
      } else if (is_name("is")) {
        const Token& is_tok = next();
        auto test = make(Expr::Kind::Test, is_tok.pos);
        if (is_name("not")) {
          next();
          test->negated = true;
        }
        test->name = expect_name("'is' test");
        const Token& n = peek();
        if (is_op("(")) {
          parse_call_args(*test, "test arguments");
        } else if ((n.kind == TK::Name && n.text != "else" && n.text != "or" && n.text != "and" && n.text != "if" &&
                    n.text != "in" && n.text != "is" && n.text != "not") ||
                   n.kind == TK::String || n.kind == TK::Int || n.kind == TK::Float || is_op("[") || is_op("{")) {
          test->args.push_back(parse_postfix(parse_primary()));
        }
        test->a = std::move(e);
        e = std::move(test);
      } else {
        return e;
      }
    }
  }

  const std::vector<Token>& toks_;
  size_t idx_ = 0;
  int depth_ = 0;  // Nest levels open
};

}  // namespace

Body parse(const std::vector<Token>& tokens) { return Parser(tokens).parse_template(); }

}  // namespace lathe::jinja
